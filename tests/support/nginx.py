"""A real nginx (Debian's package) serving conf/nginx-delegation.conf on test ports.

The shipped file is used as it stands: only the port of its two listen lines (IPv4 and
IPv6, every address, as shipped), its server name and the two upstream addresses are
replaced, each of which must be found exactly once, so a change of the file that the tests
cannot follow fails loudly instead of testing something else.
nginx runs in the foreground with its own prefix, pid file, logs and temp folders.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "conf" / "nginx-delegation.conf"
# What the shipped file says -> what the test puts there.
LISTEN = "listen 80;"
LISTEN_IPV6 = "listen [::]:80;"
SERVER_NAME = "server_name matrix.example.org;"
HOMESERVER = "server 127.0.0.1:8080;"
SYNAPSE = "server 127.0.0.1:8008;"


class NginxUnavailable(Exception):
    """nginx is not installed or does not start: the reason."""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if not found:
        raise NginxUnavailable("nginx is not installed (Debian: apt-get install nginx)")
    return found


def render(site: str, port: int, homeserver_port: int, synapse_port: int) -> str:
    """The site file with the test's addresses: the listen lines keep their families and
    addresses (all of both), only the port changes."""
    for old, new in (
        (LISTEN, f"listen {port};"),
        (LISTEN_IPV6, f"listen [::]:{port};"),
        (SERVER_NAME, "server_name 127.0.0.1 localhost;"),
        (HOMESERVER, f"server 127.0.0.1:{homeserver_port};"),
        (SYNAPSE, f"server 127.0.0.1:{synapse_port};"),
    ):
        count = len(re.findall(rf"^\s*{re.escape(old)}", site, flags=re.MULTILINE))
        assert count == 1, f"conf/nginx-delegation.conf: expected {old!r} once, found it {count} times"
        site = re.sub(rf"^(\s*){re.escape(old)}", lambda m, new=new: m.group(1) + new, site, flags=re.MULTILINE)
    return site


class Nginx:
    """nginx on `port` (every address of both families, as the shipped file listens) in
    front of this server and Synapse, until `stop()`. `other_sites` is more server blocks
    for the same http block (a stand-in for Debian's default site)."""

    def __init__(self, folder: Path, port: int, homeserver_port: int, synapse_port: int,
                 other_sites: str = "") -> None:
        self.folder = Path(folder)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        for sub in ("logs", "tmp"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        site = self.folder / "site.conf"
        site.write_text(render(SITE.read_text(), port, homeserver_port, synapse_port))
        temp = self.folder / "tmp"
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers may read our 0700 temp folders
        self.config = self.folder / "nginx.conf"
        self.config.write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {self.folder}/nginx.pid;\n"
            f"error_log {self.folder}/logs/error.log warn;\n"
            "events { worker_connections 512; }\n"
            "http {\n"
            f"    access_log {self.folder}/logs/access.log;\n"
            f"    client_body_temp_path {temp}/body;\n    proxy_temp_path {temp}/proxy;\n"
            f"    fastcgi_temp_path {temp}/fastcgi;\n    uwsgi_temp_path {temp}/uwsgi;\n"
            f"    scgi_temp_path {temp}/scgi;\n"
            f"    include {site};\n"
            f"{other_sites}"
            "}\n"
        )
        binary = nginx_binary()
        # -e: the log before the config is read (not /var/log/nginx, which a user cannot write).
        command = [binary, "-p", str(self.folder), "-c", str(self.config), "-e", str(self.folder / "logs" / "error.log")]
        check = subprocess.run([*command, "-t"], capture_output=True, text=True)
        if check.returncode != 0:
            raise AssertionError(f"nginx -t refused the config:\n{check.stderr}")
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NginxUnavailable(f"nginx exited with {self.proc.returncode}: {self.error_log()}")
            try:
                urllib.request.urlopen(self.url + "/nginx-ready", timeout=2).close()
                break
            except urllib.error.HTTPError as exc:  # any answer (a 404 here) means nginx is up
                exc.close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise NginxUnavailable(f"nginx did not answer within 20 s: {self.error_log()}")

    def error_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "logs" / "error.log").read_text(errors="replace")[-2000:]
        return ""

    def access_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "logs" / "access.log").read_text(errors="replace")
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
