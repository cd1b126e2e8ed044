"""The shipped nginx site answers a browser at `http://localhost`, as the walk-through of
docs/delegation.md has people open it.

A browser (Chromium, so Element Web and Desktop) and a stock Debian resolver (whose hosts
file names `localhost` for ::1 as well as 127.0.0.1, ::1 first) connect to ::1 first. On a
stock Debian nginx, the default site listens on both families; a site that listens on IPv4
only never sees those requests, and people get the default site's 404. So this nginx has a
stand-in for that default site beside conf/nginx-delegation.conf, which is rendered as the
tests always do (only the port of its two listen lines, the server name and the upstreams
change), and the clients connect by name.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chrome
from tests.support.helpers import ci
from tests.support.nginx import Nginx, NginxUnavailable
from tests.support.servers import Server, free_port, write_config

# Debian's /etc/nginx/sites-enabled/default, reduced to what matters here: it takes every
# request no other site's server_name claims, on both families, and answers 404.
DEFAULT_SITE = """
    server {{
        listen {port} default_server;
        listen [::]:{port} default_server;
        server_name _;
        location / {{ return 404 "Debian's default site\\n"; }}
    }}
"""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Nginx, Server]]:
    """This server (file backend) behind the shipped site, on one port for both families."""
    server = Server("--config", write_config(tmp_path))
    port = free_port()
    try:
        nginx = Nginx(tmp_path / "nginx", port, server.port, free_port(), other_sites=DEFAULT_SITE.format(port=port))
    except NginxUnavailable as exc:
        server.stop()
        if ci():
            pytest.fail(f"{exc} (CI is set: scripts/install-test-services.sh installs nginx)")
        pytest.skip(str(exc))
    yield nginx, server
    nginx.stop()
    server.stop()


def stock_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolve `localhost` as Debian's stock hosts file does (::1 first, then 127.0.0.1),
    whatever this machine's hosts file says."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "localhost":
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", int(port), 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", int(port))),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def requests_from(nginx: Nginx, address: str, marker: str, count: int = 1) -> list[str]:
    """The access-log lines of requests from `address` whose line holds `marker`, once there
    are `count` of them or 5 s passed (nginx logs a request after answering it)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [line for line in nginx.access_log().splitlines() if line.startswith(address + " ") and marker in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_a_client_that_tries_ipv6_first_reaches_the_site_by_name(site, monkeypatch):
    nginx, _ = site
    stock_localhost(monkeypatch)
    base = f"http://localhost:{nginx.port}"
    status, kind, body = get(base + "/account/?by=python")
    assert status == 200 and kind.startswith("text/html"), (status, body[:300])
    assert "Debian's default site" not in body
    status, kind, body = get(base + "/.well-known/matrix/client?by=python")
    assert status == 200 and kind.startswith("application/json"), (status, body)
    assert '"m.homeserver"' in body
    # Both went over IPv6: the site, not only the default one, listens there.
    assert len(requests_from(nginx, "::1", "by=python", 2)) == 2, nginx.access_log()
    # The default site is really there: a name no site claims lands on it, over both families.
    status, _, body = get(f"http://[::1]:{nginx.port}/account/")
    assert (status, body) == (404, "Debian's default site\n")


def test_chromium_opens_the_account_page_at_localhost(site):
    nginx, _ = site
    with chrome() as driver:
        driver.get(f"http://localhost:{nginx.port}/account/?by=chromium")
        text = driver.find_element("tag name", "body").text
        assert "Debian's default site" not in text
        assert driver.find_elements("css selector", "form input[type=password]"), driver.page_source[:1000]
    # Chromium resolves `localhost` by itself (whatever the hosts file says), ::1 first.
    assert requests_from(nginx, "::1", "by=chromium"), nginx.access_log()
