"""docs/oauth.md and docs/delegation.md as a new operator reads them: the `sessions issue`
block run as printed (an account for the bot first), the table of what clients see through
Synapse checked against a real Synapse, matrix-js-sdk's refresh as the doc tells it (read in
the release the tests install), the routes and limits that OAuth changed, the pinned Synapse.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.oauth_clients.test_synapse import oauth_stack  # noqa: F401 - a stack of this module's own
from tests.support.doc_blocks import code_blocks, section, shell_commands
from tests.support.servers import WHOAMI, Server, call, write_config
from tests.support.synapse import SYNAPSE_VERSION, http

ROOT = Path(__file__).resolve().parents[2]
OAUTH = (ROOT / "docs" / "oauth.md").read_text()
DELEGATION = (ROOT / "docs" / "delegation.md").read_text()
NGINX = (ROOT / "conf" / "nginx-delegation.conf").read_text()


def marked_block(text: str, marker: str) -> str:
    after = text.split(f"<!-- {marker} -->", 1)[1]
    blocks = code_blocks(after, "sh")
    assert blocks, marker
    return blocks[0]


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[Server, str]]:
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("the doc uses the README's .venv, which is not made here (scripts/test.sh makes it)")
    conf = write_config(tmp_path, "[rate_limit]\nenabled = false\n")
    running = Server("--config", conf)
    yield running, conf
    running.stop()


def test_the_sessions_issue_block_runs_as_printed(server, tmp_path):
    """The bot's account first (no password), then its token, with the server's own config."""
    running, conf = server
    block = marked_block(OAUTH, "sessions-issue")
    assert block.count("--config") == 3 and "add-user mybot" in block and "--no-password" in block
    tokens = tmp_path / "mybot"
    tokens.mkdir()
    script = block.replace("/etc/homeserver/homeserver.toml", conf).replace("/etc/mybot", str(tokens))
    assert len(shell_commands(script)) == 4
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, f"{script}\n{done.stderr}"
    added, monitor = done.stdout.splitlines()
    assert added == "added @mybot:localhost"
    bot = (tokens / "token").read_text().strip()
    status, me = call(running.port, WHOAMI, token=bot)
    assert (status, me["user_id"], me["device_id"]) == (200, "@mybot:localhost", "BOT")
    status, me = call(running.port, WHOAMI, token=monitor)
    assert (status, me["user_id"], me["device_id"]) == (200, "@alice:localhost", "MONITOR")


def test_the_soft_logout_claim_names_synapse():
    sessions = section(OAUTH, "Sessions")
    assert "soft_logout: true` on this\n  server's own endpoints" in sessions
    through = section(OAUTH, "What clients see through Synapse")
    assert '"error": "Token is not active", "soft_logout": false' in through
    assert "refresh on any `M_UNKNOWN_TOKEN`, whatever `soft_logout` says" in through


def test_matrix_js_sdk_refreshes_as_the_doc_says():
    """The doc's account of matrix-js-sdk 43, read in the release the tests install: no
    `soft_logout` anywhere, a refresh on M_UNKNOWN_TOKEN within 60 s of expiry (0.5 s before
    a request), a 4xx refusal a logout, anything else TokenRefreshError."""
    from tests.support.js_sdk import JS_SDK_MAJOR, install_js_sdk

    _, cache = install_js_sdk()
    src = Path(cache) / "node_modules" / "matrix-js-sdk" / "src"
    refresh = (src / "http-api" / "refresh.ts").read_text()
    fetch = (src / "http-api" / "fetch.ts").read_text()
    refresher = (src / "oauth" / "tokenRefresher.ts").read_text()
    assert "const REFRESH_ON_ERROR_IF_TOKEN_EXPIRES_WITHIN_MS = 60 * 1000;" in refresh
    assert "const REFRESH_IF_TOKEN_EXPIRES_WITHIN_MS = 500;" in refresh
    assert 'error.errcode === "M_UNKNOWN_TOKEN"' in fetch and "TokenRefreshError" in fetch
    assert not any("soft_logout" in path.read_text() for path in src.rglob("*.ts"))
    assert "error.httpStatus < 500" in refresher and "error.httpStatus >= 400" in refresher
    through = section(OAUTH, "What clients see through Synapse")
    assert f"matrix-js-sdk {JS_SDK_MAJOR} does nearly this" in through
    assert "expires within 60 s" in through and "within 0.5 s of expiry" in through


def test_delegation_names_the_oauth_api_it_routes():
    limits = section(DELEGATION, "Limits")
    assert "no OAuth 2.0 authorization server" not in limits and "no refresh" not in limits
    assert "[oauth] enabled" in limits and "Token is not active" in limits
    routes = section(DELEGATION, "Routes")
    assert "`/oauth2/device`" in routes and "`/account/device`" in routes
    nginx = section(DELEGATION, "The nginx file")
    for path in ("/oauth2/registration", "/oauth2/token", "/oauth2/revoke", "/oauth2/device"):
        assert f"`{path}`" in nginx, path
        routed = re.search(r"location ~ \^/oauth2/\(([^)]*)\)\$", NGINX)
        assert routed is not None and path.split("/")[-1] in routed.group(1).split("|"), path
    comment = NGINX.split("\nupstream ", 1)[0]
    assert "answers 404\n#     M_UNRECOGNIZED so that clients choose password login" not in comment
    assert "/oauth2/device" in comment and "[oauth] enabled" in comment


def test_the_walkthrough_pins_the_tested_synapse_and_says_what_clients_need():
    walk = section(DELEGATION, "Walk-through")
    installs = [c for b in code_blocks(walk, "sh") for c in shell_commands(b) if "pip install matrix-synapse" in c]
    assert installs == [f"~/matrix/synapse-venv/bin/pip install matrix-synapse=={SYNAPSE_VERSION}"]
    assert "Node.js 22 or newer" in walk and "Promise.withResolvers" in walk
    tls = section(DELEGATION, "TLS in front")
    assert "https://<server name>/.well-known/matrix/client" in tls and "certbot --nginx" in tls
    assert "over https only" in walk


# -- the table, against a real Synapse ------------------------------------------------------


def synapse_refuses(stack, token: str) -> dict:
    status, body = http(stack.synapse.url + WHOAMI, token=token)
    assert status == 401, body
    return dict(body)


def test_what_clients_see_through_synapse(oauth_stack):  # noqa: F811
    """docs/oauth.md's table: expired, locked and revoked are one answer at Synapse, three here;
    a refresh tells them apart, as the doc tells clients to do."""
    from tests.oauth_clients.flow import OAuthClient
    from tests.oauth_clients.stack import LIFETIME

    stack = oauth_stack
    inactive = {"errcode": "M_UNKNOWN_TOKEN", "error": "Token is not active", "soft_logout": False}
    client = OAuthClient(stack.url, client_name="doc table")
    tokens = client.sign_in("grace", "grace-password", device_id="DOCTABLE")
    assert stack.whoami(tokens.access_token)[0] == 200

    # Expired: soft here, not at Synapse; the refresh goes on.
    time.sleep(LIFETIME + 1)
    assert synapse_refuses(stack, tokens.access_token) == inactive
    status, here = stack.homeserver_call(WHOAMI, token=tokens.access_token)
    assert (status, here["errcode"], here["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", True), here
    refreshed = client.token(grant_type="refresh_token", refresh_token=tokens.refresh_token)
    assert refreshed.status == 200, refreshed
    fresh, refresh_token = refreshed.json["access_token"], refreshed.json["refresh_token"]

    # Locked: M_USER_LOCKED here, inactive at Synapse for a token it has not seen; the refresh
    # answers and its token is refused as well (the doc's "stop and say so").
    assert stack.homeserver.run_py("lock", "grace").returncode == 0
    deadline = time.monotonic() + 15
    while (status := stack.homeserver_call(WHOAMI, token=fresh)[0]) != 401:
        assert time.monotonic() < deadline, "the lock not seen"
        time.sleep(0.2)
    status, here = stack.homeserver_call(WHOAMI, token=fresh)
    assert (status, here["errcode"], here["soft_logout"]) == (401, "M_USER_LOCKED", True), here
    assert synapse_refuses(stack, fresh) == inactive
    again = client.token(grant_type="refresh_token", refresh_token=refresh_token)
    assert again.status == 200, again
    assert synapse_refuses(stack, again.json["access_token"]) == inactive
    assert stack.homeserver.run_py("unlock", "grace").returncode == 0
    refresh_token = again.json["refresh_token"]
    deadline = time.monotonic() + 15
    while stack.homeserver_call(WHOAMI, token=again.json["access_token"])[0] != 200:
        assert time.monotonic() < deadline, "the unlock not seen"
        time.sleep(0.2)
    unlocked = client.token(grant_type="refresh_token", refresh_token=refresh_token)
    assert unlocked.status == 200, unlocked
    assert stack.whoami(unlocked.json["access_token"])[0] == 200

    # Revoked: hard everywhere, and the refresh is invalid_grant.
    assert client.revoke(unlocked.json["refresh_token"]).status == 200
    assert synapse_refuses(stack, unlocked.json["access_token"]) == inactive
    status, here = stack.homeserver_call(WHOAMI, token=unlocked.json["access_token"])
    assert (status, here["errcode"], here["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False), here
    refused = client.token(grant_type="refresh_token", refresh_token=unlocked.json["refresh_token"])
    assert refused.status == 400 and refused.json["error"] == "invalid_grant", refused

