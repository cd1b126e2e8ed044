"""The device authorization grant and `sessions issue` with users and sessions on a real Redis."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import uuid

import pytest

from homeserver import cli
from homeserver.oauth import device
from tests.oauth.device_helpers import DeviceClient, Person
from tests.support.helpers import JWT_SECRET, assert_error, assert_json
from tests.support.redis_servers import redis_overrides

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def sessions_prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


@pytest.fixture
def config_overrides(redis_users, redis_url, sessions_prefix):
    return {
        **redis_overrides(redis_users), "oauth": {"enabled": True}, "sessions": {"store": "redis"},
        "sessions.redis": {"url": redis_url, "key_prefix": sessions_prefix},
    }


async def test_the_device_flow_on_redis(fetch, monkeypatch):
    client, person = DeviceClient(fetch), Person(fetch)
    codes = await client.codes("REDISDEV")
    assert (await client.poll(codes["device_code"])).json["error"] == "authorization_pending"
    assert (await client.poll(codes["device_code"])).json["error"] == "slow_down"
    await person.approve(codes["verification_uri_complete"])
    monkeypatch.setattr(device, "INTERVAL", 0)
    tokens = assert_json(await client.poll(codes["device_code"]))
    me = assert_json(await fetch(WHOAMI, token=tokens["access_token"]))
    assert me["device_id"] == "REDISDEV"
    assert (await client.poll(codes["device_code"])).json["error"] == "invalid_grant"
    denied = await client.codes("REDISDENY")
    await person.approve(denied["verification_uri"], denied["user_code"], allow=False)
    assert (await client.poll(denied["device_code"])).json["error"] == "access_denied"


async def test_sessions_issue_for_a_redis_user(fetch, tmp_path, redis_users, redis_url, sessions_prefix):
    config = tmp_path / "issue.toml"
    config.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend]\ntype = "redis"\n'
        f'[backend.redis]\nurl = "{redis_users.url}"\nkey_prefix = "{redis_users.prefix}"\n'
        f'email_key_prefix = "{redis_users.email_prefix}"\n'
        f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis_url}"\nkey_prefix = "{sessions_prefix}"\n'
    )
    out = io.StringIO()

    def issue() -> int:
        with contextlib.redirect_stdout(out):
            return cli.main(["sessions", "issue", "bob", "--device", "REDISBOT", "--config", str(config)])

    # The CLI runs its own event loop: in another thread, as tests/backends/test_redis_cli.py does.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(issue).result() == 0
    token = out.getvalue().strip()
    me = assert_json(await fetch(WHOAMI, token=token))
    assert (me["user_id"], me["device_id"]) == ("@bob:localhost", "REDISBOT")
    devices = assert_json(await fetch("/_matrix/client/v3/devices", token=token))["devices"]
    assert [d["display_name"] for d in devices if d["device_id"] == "REDISBOT"] == ["issued by the operator"]
    # A user removed from the store loses it.
    redis_users.client.delete(redis_users.prefix + "bob")
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
