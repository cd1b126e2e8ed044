"""The bench's constants, processes it starts and plain HTTP calls to them, and what every
bench script does around its run (clean-up, the report and its file)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from targets import Target

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VENV = ROOT / ".venv"
LUA = BENCH / "wrk_report.lua"
RESULTS = BENCH / "results"

BENCH_USER = "bench"
BENCH_PASSWORD = "bench-password-123"
SERVER_NAME = "localhost"
VERSIONS = "/_matrix/client/versions"
PROFILE = f"/_matrix/client/v3/profile/@{BENCH_USER}:{SERVER_NAME}"
CAPABILITIES = "/_matrix/client/v3/capabilities"
WHOAMI = "/_matrix/client/v3/account/whoami"
LOGOUT = "/_matrix/client/v3/logout"
LOGIN = "/_matrix/client/v3/login"
LOGIN_BODY = json.dumps(
    {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": BENCH_USER}, "password": BENCH_PASSWORD}
)
# Synapse 1.163 on a machine like this one, wrk -t1 -c50 (req/s); we aim for 3x.
SYNAPSE = {"versions": 2400.0, "profile": 1050.0, "capabilities": 1400.0}
INSTALL_WRK = "apt-get update && apt-get install -y wrk   (Debian/Ubuntu; as root or with sudo)"


class Processes:
    """Every server the bench starts; all are stopped on exit, Ctrl-C or failure."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        log = open(log_path, "wb")
        # Own session: a Ctrl-C reaches only the bench, which then stops the servers itself.
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            # The whole session: a multi-process server's workers go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Workers may outlive a parent that exited first.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


@contextlib.contextmanager
def bench_run(prefix: str) -> Iterator[tuple[Processes, Path]]:
    """The servers of one bench run and a temporary folder (named `prefix`...): every server
    stopped and the folder removed on the way out, done, failed or interrupted. SIGTERM takes
    Ctrl-C's path (a KeyboardInterrupt, for the caller to answer with `interrupted()`)."""
    procs = Processes()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield procs, tmp
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def interrupted() -> int:
    """Say so, once the servers are stopped; the exit status of an interrupted run."""
    print("\ninterrupted; servers stopped", file=sys.stderr)
    return 130


def wrk_missing() -> bool:
    """True, having said how to install it, when wrk is not on PATH."""
    if shutil.which("wrk") is None:
        print(f"wrk is not installed. Install it with:\n  {INSTALL_WRK}", file=sys.stderr)
        return True
    return False


def finish(results: dict[str, Any], targets: list[Target], output: str | None, stem: str, load_note: str = "") -> int:
    """Print the targets and the load average at the end (`results["load_average_at_end"]`),
    write `results` to `output` or bench/results/<stem>-<UTC time>.json; the exit status (0
    when every target passed, else 1)."""
    print("\ntargets (ratios measured in this run):")
    for t in targets:
        print(t.line())
    print(f"load average at end: {results['load_average_at_end']}{load_note}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(output) if output else RESULTS / time.strftime(f"{stem}-%Y%m%dT%H%M%SZ.json", time.gmtime())
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {out}")
    return 0 if all(t.passed for t in targets) else 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(proc: subprocess.Popen[bytes] | None, base: str, log_path: Path | None, timeout: float = 30) -> float:
    """Poll /versions until it answers 200; return the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{tail}")
        with contextlib.suppress(OSError):
            if http(base + VERSIONS, timeout=1)[0] == 200:
                return time.monotonic() - start
        time.sleep(0.02)
    raise RuntimeError(f"{base} did not answer within {timeout} s")


def rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB (MiB)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    out += [int(child), *descendants(int(child))]
    return out


def require_loopback(url: str) -> None:
    """Load goes to this machine only."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"refusing to send load to {host!r}: only 127.0.0.0/8, ::1 or localhost")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants so far."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
