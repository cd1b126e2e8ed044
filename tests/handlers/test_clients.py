"""Real Matrix client libraries (matrix-nio, mautrix, matrix-js-sdk) against the server."""

import asyncio
import json
import os
import subprocess

import pytest
from mautrix.client import Client as MautrixClient
from mautrix.errors import MForbidden, MNotFound, MUnknownToken
from mautrix.types import LoginType, UserID
from nio import (
    AsyncClient,
    DiscoveryInfoResponse,
    LoginError,
    LoginResponse,
    ProfileGetError,
    ProfileGetResponse,
)

from tests.support.js_sdk import install_js_sdk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def config_overrides(http_server_port):
    return {"server": {"base_url": f"http://127.0.0.1:{http_server_port[1]}"}}


@pytest.fixture
def base(http_server_port):
    return f"http://127.0.0.1:{http_server_port[1]}"


async def test_matrix_nio(base, http_server):
    client = AsyncClient(base, "@alice:localhost")
    try:
        discovery = await client.discovery_info()
        assert isinstance(discovery, DiscoveryInfoResponse) and discovery.homeserver_url == base
        login = await client.login("wonderland")
        assert isinstance(login, LoginResponse), login
        assert (login.user_id, login.device_id) == ("@alice:localhost", "DUMMY")
        profile = await client.get_profile("@alice:localhost")
        assert isinstance(profile, ProfileGetResponse)
        assert (profile.displayname, profile.avatar_url) == ("Alice [alice]", "mxc://localhost/alice")
        assert (await client.whoami()).user_id == "@alice:localhost"
        missing = await client.get_profile("@nobody:localhost")
        assert isinstance(missing, ProfileGetError) and missing.status_code == "M_NOT_FOUND"
    finally:
        await client.close()
    wrong = AsyncClient(base, "alice")
    try:
        error = await wrong.login("not-the-password")
        assert isinstance(error, LoginError) and error.status_code == "M_FORBIDDEN"
    finally:
        await wrong.close()


async def test_mautrix(base, http_server):
    client = MautrixClient(base_url=base)
    try:
        assert (await client.versions()).supports("v1.12")
        assert [f.type for f in (await client.get_login_flows()).flows] == [LoginType.PASSWORD]
        login = await client.login(identifier="alice", login_type=LoginType.PASSWORD, password="wonderland",
                                   store_access_token=True)
        assert login.user_id == "@alice:localhost"
        assert (await client.whoami()).user_id == "@alice:localhost"
        profile = await client.get_profile(UserID("@alice:localhost"))
        assert profile.displayname == "Alice [alice]" and profile.avatar_url == "mxc://localhost/alice"
        assert await client.get_displayname(UserID("@bob:localhost")) == "bob-ident"
        caps = await client.api.request("GET", "/_matrix/client/v3/capabilities")
        assert caps["capabilities"]["m.change_password"] == {"enabled": False}
        with pytest.raises(MNotFound):
            await client.get_profile(UserID("@nobody:localhost"))
        with pytest.raises(MForbidden):
            await client.login(identifier="alice", login_type=LoginType.PASSWORD, password="wrong")
    finally:
        await client.api.session.close()


JS_CHECK = r"""
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
logger.disableAll();
const base = process.argv[2];
const out = {};
const discovered = await sdk.AutoDiscovery.fromDiscoveryConfig({"m.homeserver": {base_url: base}});
out.discovery = [discovered["m.homeserver"].state, discovered["m.homeserver"].base_url, discovered["m.homeserver"].error];
const client = sdk.createClient({ baseUrl: base });
out.versions = (await client.getVersions()).versions;
const login = await client.loginRequest({ type: "m.login.password", identifier: { type: "m.id.user", user: "alice" }, password: "wonderland" });
out.user_id = login.user_id;
const authed = sdk.createClient({ baseUrl: base, accessToken: login.access_token, userId: login.user_id });
out.whoami = (await authed.whoami()).user_id;
out.profile = await authed.getProfileInfo("@alice:localhost");
out.capabilities = Object.keys(await authed.getCapabilities()).sort();
try { await client.loginRequest({ type: "m.login.password", identifier: { type: "m.id.user", user: "alice" }, password: "bad" }); }
catch (e) { out.bad_login = [e.httpStatus, e.errcode]; }
// Sessions: a second device, the device list, a rename, deletion through UIA, logout.
const phone = await client.loginRequest({ type: "m.login.password", identifier: { type: "m.id.user", user: "alice" },
  password: "wonderland", device_id: "JSPHONE", initial_device_display_name: "js phone" });
const phoneClient = sdk.createClient({ baseUrl: base, accessToken: phone.access_token, userId: phone.user_id });
out.devices = (await authed.getDevices()).devices.map(d => [d.device_id, d.display_name]).sort();
await authed.setDeviceDetails("JSPHONE", { display_name: "renamed" });
out.renamed = (await authed.getDevice("JSPHONE")).display_name;
let session = null;
try { await authed.deleteDevice("JSPHONE"); }
catch (e) { out.uia = [e.httpStatus, e.errcode ?? null, e.data.flows]; session = e.data.session; }
const auth = { type: "m.login.password", identifier: { type: "m.id.user", user: "alice" }, password: "wonderland", session };
await authed.deleteDevice("JSPHONE", auth);
try { await phoneClient.whoami(); } catch (e) { out.phone_after_delete = [e.httpStatus, e.errcode, e.data.soft_logout]; }
await authed.logout();
const stale = sdk.createClient({ baseUrl: base, accessToken: login.access_token, userId: login.user_id });
try { await stale.whoami(); } catch (e) { out.after_logout = [e.httpStatus, e.errcode, e.data.soft_logout]; }
console.log(JSON.stringify(out));
"""


# The current major release (`npm view matrix-js-sdk version` gave 43.0.0); each major gets
# its own cache folder, so moving the pin installs the new one.


@pytest.fixture(scope="session")
def js_sdk(tmp_path_factory):
    """matrix-js-sdk installed from the npm registry into a cache inside .venv."""
    node, cache = install_js_sdk()
    script = os.path.join(cache, "check.mjs")
    with open(script, "w") as fh:
        fh.write(JS_CHECK)
    return node, script


async def test_matrix_js_sdk(base, http_server, js_sdk):
    node, script = js_sdk
    proc = await asyncio.create_subprocess_exec(node, script, base, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    # AutoDiscovery reads the well-known, then wants one of its SUPPORTED_MATRIX_VERSIONS
    # (v1.1 to v1.13 in lib/version-support.js of js-sdk 43) in /versions: ["v1.12"] is.
    assert out["discovery"] == ["SUCCESS", base, None], out
    assert out["versions"] == ["v1.12"]
    assert out["user_id"] == "@alice:localhost" and out["whoami"] == "@alice:localhost"
    assert out["profile"] == {"displayname": "Alice [alice]", "avatar_url": "mxc://localhost/alice"}
    assert "m.room_versions" in out["capabilities"] and "m.change_password" in out["capabilities"]
    assert out["bad_login"] == [403, "M_FORBIDDEN"]
    # Sessions through js-sdk's own calls: the first UIA answer has no errcode.
    assert out["devices"] == [["DUMMY", ""], ["JSPHONE", "js phone"]]
    assert out["renamed"] == "renamed"
    assert out["uia"] == [401, None, [{"stages": ["m.login.password"]}]]
    assert out["phone_after_delete"] == [401, "M_UNKNOWN_TOKEN", False]
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN", False]


async def test_matrix_nio_sessions(base, http_server):
    """nio logs in on two devices, lists them, renames one, deletes one through UIA, logs out."""
    from nio import (
        DeleteDevicesAuthResponse,
        DeleteDevicesResponse,
        DevicesResponse,
        LogoutResponse,
        UpdateDeviceResponse,
        WhoamiError,
    )

    phone = AsyncClient(base, "@alice:localhost", device_id="PHONE")
    laptop = AsyncClient(base, "@alice:localhost", device_id="LAPTOP")
    try:
        assert isinstance(await phone.login("wonderland", device_name="Phone"), LoginResponse)
        assert isinstance(await laptop.login("wonderland"), LoginResponse)
        devices = await laptop.devices()
        assert isinstance(devices, DevicesResponse), devices
        by_id = {d.id: d for d in devices.devices}
        assert set(by_id) == {"PHONE", "LAPTOP"} and by_id["PHONE"].display_name == "Phone"
        assert isinstance(await laptop.update_device("LAPTOP", {"display_name": "Laptop"}), UpdateDeviceResponse)
        # UIA: nio's first call gets the flows and a session, the second one passes the password.
        first = await laptop.delete_devices(["PHONE"])
        assert isinstance(first, DeleteDevicesAuthResponse), first
        auth = {"type": "m.login.password", "user": "alice", "password": "wonderland", "session": first.session}
        assert isinstance(await laptop.delete_devices(["PHONE"], auth), DeleteDevicesResponse)
        gone = await phone.whoami()
        assert isinstance(gone, WhoamiError) and gone.status_code == "M_UNKNOWN_TOKEN"
        token = laptop.access_token
        assert isinstance(await laptop.logout(), LogoutResponse)
        laptop.access_token = token  # nio forgets it on logout; the server must refuse it too
        gone = await laptop.whoami()
        assert isinstance(gone, WhoamiError) and gone.status_code == "M_UNKNOWN_TOKEN"
    finally:
        await phone.close()
        await laptop.close()


async def test_mautrix_sessions(base, http_server):
    """mautrix logs in twice, logs one session out, then every session with logout_all."""
    first, second = MautrixClient(base_url=base), MautrixClient(base_url=base)
    try:
        for client in (first, second):
            await client.login(identifier="alice", login_type=LoginType.PASSWORD, password="wonderland",
                               store_access_token=True)
        devices = await second.api.request("GET", "/_matrix/client/v3/devices")
        assert [d["device_id"] for d in devices["devices"]] == ["DUMMY"]
        token = first.api.token
        await first.logout()
        first.api.token = token
        with pytest.raises(MUnknownToken):
            await first.whoami()
        assert (await second.whoami()).user_id == "@alice:localhost"
        await second.logout_all()
    finally:
        await first.api.session.close()
        await second.api.session.close()
