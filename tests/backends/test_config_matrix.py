"""Every switch with every other: one client scenario on a pairwise-covering set of configurations.

Each feature has tests of its own, but operators turn them on together (a metrics switch
once broke login by e-mail address and no test saw it). Here real `run.py` processes run
on real stores, the user backend (file, Redis, LDAP) x the session store (SQLite, Redis)
x metrics (off, on) x worker processes (1, 2) x delegation to a real Synapse (off, on),
in a set of configurations that holds every pair of settings at least once (checked
below), and each runs the same scenario: login by name and by e-mail address, profile,
whoami, capabilities, the devices list, a second login, and a logout that leaves the
other token alive, on every worker; then (file and Redis) a lock, an unlock and a
password reset. With delegation, Synapse is asked too: each login has its own device
there, the logged-out token is refused by Synapse and the others taken, every worker
introspects alike, a lock keeps the devices at Synapse and a reset deletes them. The OAuth
rows and the second-factor rows (`[mfa]`: a factor required by the config or by the user
store's mark, added at the first browser sign-in, asked at the next) cover their own pairs.
"""

from __future__ import annotations

import itertools
import json
import secrets
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.support.helpers import DEFAULT_USERS, Response, assert_error, assert_json, ci, record
from tests.support.openapi import validate
from tests.support.servers import ServerProcess
from tests.support.slapd import READER_DN, READER_PASSWORD, SUFFIX, Slapd
from tests.support.synapse import Synapse, SynapseUnavailable, http

SYNAPSE_SECRET = "matrix-test-secret-shared-with-synapse-0123456789"
# alice (in every row's users file) is a Synapse admin: her token reads bob's devices there.
ADMIN = "alice"

FACTORS = {
    "backend": ("file", "redis", "ldap"),
    "sessions": ("sqlite", "redis"),
    "metrics": (False, True),
    "processes": (1, 2),
    "delegation": (False, True),
}
# Six rows hold every pair of the five factors' values (the fewest possible: 3 x 2).
MATRIX = [
    ("file", "sqlite", False, 1, False),
    ("file", "redis", True, 2, True),
    ("redis", "sqlite", True, 2, False),
    ("redis", "redis", False, 1, True),
    ("ldap", "sqlite", False, 2, True),
    ("ldap", "redis", True, 1, False),
]

# The user of the scenario, the same in every user store (the test directory has bob too).
NAME, PASSWORD, EMAIL = "bob", "builder", "bob@example.org"
API = "/_matrix/client/v3"


def test_the_matrix_covers_every_pair_of_settings() -> None:
    names = list(FACTORS)
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        seen = {(row[i], row[j]) for row in MATRIX}
        wanted = set(itertools.product(FACTORS[a], FACTORS[b]))
        assert seen == wanted, f"{a} x {b}: missing {wanted - seen}"


def users_section(backend: str, redis_url: str, prefix: str, slapd: Slapd | None) -> str:
    if backend == "file":
        return ""  # the default: users.json beside the config
    if backend == "redis":
        return (
            f'[backend]\ntype = "redis"\n[backend.redis]\nurl = "{redis_url}"\n'
            f'key_prefix = "{prefix}user:"\nemail_key_prefix = "{prefix}email:"\n'
        )
    assert slapd is not None
    return (
        f'[backend]\ntype = "ldap"\n[backend.ldap]\nuri = "{slapd.uri}"\nbase = "{SUFFIX}"\n'
        f'bind_dn = "{READER_DN}"\nbind_password = "{READER_PASSWORD}"\ntimeout = 5.0\n'
    )


def sessions_section(store: str, redis_url: str, prefix: str) -> str:
    if store == "sqlite":
        return ""  # the default: sessions.db beside the config
    return f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis_url}"\nkey_prefix = "{prefix}session:"\n'


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def login_body(**identifier: str) -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": identifier, "password": PASSWORD}


def every_worker(server: ServerProcess, processes: int, check: Any) -> None:
    """Run `check` on fresh connections until every worker has answered one (their pids), for
    up to 30 s: a worker may still be starting (the server says it listens before it forks)."""
    pids: set[int] = set()
    deadline = time.monotonic() + 30
    while len(pids) < processes:
        assert time.monotonic() < deadline, f"only workers {pids} answered"
        check()
        pids.add(server.request("/health")[1]["pid"])
    for _ in range(10):  # and a few more, whichever worker takes them
        check()


def introspect(server: ServerProcess, token: str) -> Any:
    """POST /oauth2/introspect as Synapse sends it; the 200 answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/oauth2/introspect",
        data=f"token={token}&token_type_hint=access_token".encode(),
        headers={"Authorization": f"Bearer {SYNAPSE_SECRET}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(request, timeout=20) as resp:
        return assert_json(Response(resp.status, resp.headers, resp.read()))


@pytest.mark.parametrize(("backend", "sessions", "metrics", "processes", "delegation"), MATRIX)
def test_one_client_scenario_in_every_configuration(
    tmp_path,
    request,
    redis_url,
    redis_client,
    backend: str,
    sessions: str,
    metrics: bool,
    processes: int,
    delegation: bool,
) -> None:
    prefix = f"matrix-{secrets.token_hex(4)}:"
    slapd = request.getfixturevalue("slapd") if backend == "ldap" else None
    if backend == "redis":
        stored = record(NAME, PASSWORD, "bob-ident")
        redis_client.hset(f"{prefix}user:{NAME}", mapping={"password": stored["password"], "ident": "bob-ident",
                                                          "email": EMAIL})
        redis_client.sadd(f"{prefix}email:{EMAIL}", NAME)
        alice = DEFAULT_USERS[0]
        redis_client.hset(f"{prefix}user:{ADMIN}", mapping={"password": alice["password"], "ident": alice["ident"]})
    users = [*DEFAULT_USERS[:1], record(NAME, PASSWORD, "bob-ident", email=EMAIL)]
    extra = users_section(backend, redis_url, prefix, slapd) + sessions_section(sessions, redis_url, prefix)
    extra += f"[metrics]\nenabled = {json.dumps(metrics)}\n"
    # With delegation: this server first (it waits for Synapse), then the Synapse asking it.
    synapse = Synapse(tmp_path / "synapse") if delegation else None
    if synapse is not None:
        extra += (
            f'[delegation]\nenabled = true\nsynapse_url = "{synapse.url}"\nsecret = "{SYNAPSE_SECRET}"\n'
            f'admins = ["{ADMIN}"]\n'
        )
    server = ServerProcess(tmp_path, processes, extra, users=users)
    try:
        view = None
        if synapse is not None:
            view = AtSynapse(synapse, server)
        tokens = scenario(server, processes, metrics, view)
        if backend != "ldap":  # the shared test directory is read-only (LDAP: test_account_state_ldap.py)
            store = UserStore(backend, server, processes, redis_client, f"{prefix}user:{NAME}")
            account_state(server, processes, store, tokens, view)
    finally:
        server.stop()
        if synapse is not None:
            synapse.stop()
        for key in redis_client.scan_iter(f"{prefix}*"):
            redis_client.delete(key)


class AtSynapse:
    """The Synapse of a delegation row, started against this row's server: what it answers and holds."""

    def __init__(self, synapse: Synapse, server: ServerProcess) -> None:
        self.synapse = synapse
        synapse.mas_endpoint, synapse.mas_secret = f"http://127.0.0.1:{server.port}/", SYNAPSE_SECRET
        synapse._write_config()
        try:
            synapse.start()
        except SynapseUnavailable as exc:
            if ci():
                pytest.fail(f"{exc} (CI is set: the Synapse tests must run)")
            pytest.skip(str(exc))
        admin = server.fetch(f"{API}/login", {**login_body(type="m.id.user", user=ADMIN), "password": "wonderland"})
        self.admin_token = assert_json(admin)["access_token"]

    def whoami(self, token: str) -> int:
        return http(f"{self.synapse.url}{API}/account/whoami", token=token)[0]

    def devices(self) -> set[str]:
        """bob's devices at Synapse (its admin API, with alice's token)."""
        status, body = http(f"{self.synapse.url}/_synapse/admin/v2/users/@{NAME}:localhost/devices",
                            token=self.admin_token)
        assert status == 200, (status, body)
        return {d["device_id"] for d in body["devices"]}


def scenario(server: ServerProcess, processes: int, metrics: bool, synapse: AtSynapse | None) -> list[str]:
    assert_json(server.fetch("/health/ready"))

    # Login by name, then by e-mail address (Element's m.id.thirdparty): the same user.
    by_name = server.fetch(f"{API}/login", login_body(type="m.id.user", user=NAME))
    first = assert_json(by_name)
    validate(by_name, "login.yaml", "/login", "POST")
    by_email = server.fetch(f"{API}/login", login_body(type="m.id.thirdparty", medium="email", address=EMAIL.upper()))
    second = assert_json(by_email)
    assert first["user_id"] == second["user_id"] == f"@{NAME}:localhost", (first, second)
    assert first["access_token"] != second["access_token"]

    profile = server.fetch(f"{API}/profile/@{NAME}:localhost")
    assert "bob-ident" in assert_json(profile)["displayname"] or "Bob" in profile.json["displayname"]
    validate(profile, "profile.yaml", "/profile/{userId}")

    whoami = server.fetch(f"{API}/account/whoami", token=first["access_token"])
    assert assert_json(whoami)["user_id"] == first["user_id"]
    validate(whoami, "whoami.yaml", "/account/whoami")
    capabilities = server.fetch(f"{API}/capabilities", token=second["access_token"])
    assert "m.change_password" in assert_json(capabilities)["capabilities"]
    validate(capabilities, "capabilities.yaml", "/capabilities")
    devices = server.fetch(f"{API}/devices", token=first["access_token"])
    # Without delegation both logins share DUMMY; with it each has its own device.
    assert (first["device_id"] == second["device_id"] == "DUMMY") is (synapse is None), (first, second)
    ids = sorted({first["device_id"], second["device_id"]})
    assert [d["device_id"] for d in assert_json(devices)["devices"]] == ids
    validate(devices, "device_management.yaml", "/devices")

    # A second login, then a logout of the first: its token is dead on every worker, the
    # other alive on every worker.
    third = assert_json(server.fetch(f"{API}/login", login_body(type="m.id.user", user=NAME)))
    assert assert_json(server.fetch(f"{API}/logout", {}, token=first["access_token"])) == {}

    def first_dead_others_alive() -> None:
        body = assert_error(server.fetch(f"{API}/account/whoami", token=first["access_token"]), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is False
        for token in (second["access_token"], third["access_token"]):
            assert assert_json(server.fetch(f"{API}/account/whoami", token=token))["user_id"] == first["user_id"]

    every_worker(server, processes, first_dead_others_alive)
    if synapse is not None:
        # Synapse got each login's device first, and the logout's deleted before the answer:
        # the logged-out token is refused there from the next request, the others taken.
        assert synapse.devices() == {second["device_id"], third["device_id"]}
        assert synapse.whoami(first["access_token"]) == 401
        assert synapse.whoami(second["access_token"]) == synapse.whoami(third["access_token"]) == 200

        def introspected_alike() -> None:
            assert introspect(server, first["access_token"]) == {"active": False}
            answer = introspect(server, third["access_token"])
            assert (answer["active"], answer["username"], answer["device_id"]) == (True, NAME, third["device_id"])

        every_worker(server, processes, introspected_alike)

    exposition = server.fetch("/metrics")
    if metrics:
        assert exposition.status == 200 and b"homeserver_logins_total" in exposition.body, exposition
    else:
        assert_error(exposition, 404, "M_UNRECOGNIZED")
    return [second["access_token"], third["access_token"]]


class UserStore:
    """Change bob's record as an operator would: the users file (then SIGHUP), or his Redis hash."""

    def __init__(self, backend: str, server: ServerProcess, processes: int, client: redis.Redis, key: str) -> None:
        self.backend, self.server, self.processes, self.client, self.key = backend, server, processes, client, key
        self.reloads = 0

    def change(self, **fields: Any) -> None:
        if self.backend == "redis":
            for name, value in fields.items():
                if value is None:
                    self.client.hdel(self.key, name)
                else:
                    self.client.hset(self.key, name, "true" if value is True else value)
            return
        document = json.loads(self.server.users.read_text())
        for entry in document["users"]:
            if entry["name"] == NAME:
                entry.update(fields)
                for name in [k for k, v in entry.items() if v is None]:
                    del entry[name]
        self.server.users.write_text(json.dumps(document))
        self.server.proc.send_signal(signal.SIGHUP)
        self.reloads += 1
        self.server.wait_log_count("reloaded users file", self.reloads * self.processes)


def account_state(
    server: ServerProcess, processes: int, store: UserStore, tokens: list[str], synapse: AtSynapse | None
) -> None:
    """Locked, unlocked, reset: every worker answers from the next request on (and Synapse's
    introspection with it; the reset deletes the devices at Synapse)."""

    def whoami(token: str) -> Any:
        return server.fetch(f"{API}/account/whoami", token=token)

    store.change(locked=True)

    def locked() -> None:
        for token in tokens:
            assert assert_error(whoami(token), 401, "M_USER_LOCKED")["soft_logout"] is True
            if synapse is not None:
                assert introspect(server, token) == {"active": False}

    every_worker(server, processes, locked)
    if synapse is not None:
        assert len(synapse.devices()) == 2  # a lock keeps the devices (and their keys)
    store.change(locked=None)
    every_worker(server, processes, lambda: [assert_json(whoami(token)) for token in tokens])
    # A reset ends the sessions opened before it (with end_on_password_change on or off: a
    # users-file record or Redis hash has no identity but its hash, README "Account state").
    store.change(password=record(NAME, "a new password")["password"])

    def ended() -> None:
        for token in tokens:
            assert assert_error(whoami(token), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False

    every_worker(server, processes, ended)
    if synapse is not None:
        assert synapse.devices() == set()  # the reset deleted them at Synapse...
        assert all(synapse.whoami(token) == 401 for token in tokens)  # ...so it refuses the tokens at once


# -- OAuth 2.0 rows (issue 26) ------------------------------------------------------------------
# The code grant, refresh and revocation with a plain HTTP client (the sign-in form posted
# with its hidden fields and cookies, tests/oauth_clients/flow.py) over each user store and
# session store, with one and two worker processes: every pair of those settings once.
OAUTH_FACTORS = {"backend": FACTORS["backend"], "sessions": FACTORS["sessions"], "processes": FACTORS["processes"]}
OAUTH_MATRIX = [
    ("file", "sqlite", 1),
    ("file", "redis", 2),
    ("redis", "sqlite", 2),
    ("redis", "redis", 1),
    ("ldap", "sqlite", 2),
    ("ldap", "redis", 1),
]


def test_the_oauth_rows_cover_every_pair_of_settings() -> None:
    names = list(OAUTH_FACTORS)
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        seen = {(row[i], row[j]) for row in OAUTH_MATRIX}
        assert seen == set(itertools.product(OAUTH_FACTORS[a], OAUTH_FACTORS[b])), f"{a} x {b}"


@pytest.mark.parametrize(("backend", "sessions", "processes"), OAUTH_MATRIX)
def test_oauth_code_grant_refresh_and_revocation_in_every_store(
    tmp_path, request, redis_url, redis_client, backend: str, sessions: str, processes: int
) -> None:
    from tests.oauth_clients.flow import OAuthClient

    prefix = f"matrix-{secrets.token_hex(4)}:"
    slapd = request.getfixturevalue("slapd") if backend == "ldap" else None
    if backend == "redis":
        stored = record(NAME, PASSWORD, "bob-ident")
        redis_client.hset(f"{prefix}user:{NAME}", mapping={"password": stored["password"], "ident": "bob-ident",
                                                          "email": EMAIL})
        redis_client.sadd(f"{prefix}email:{EMAIL}", NAME)
    users = [*DEFAULT_USERS[:1], record(NAME, PASSWORD, "bob-ident", email=EMAIL)]
    extra = users_section(backend, redis_url, prefix, slapd) + sessions_section(sessions, redis_url, prefix)
    extra += "[oauth]\nenabled = true\n"
    server = ServerProcess(tmp_path, processes, extra, users=users)
    try:
        base = f"http://127.0.0.1:{server.port}"
        # Registered on one worker, known to all (the session store holds clients): each
        # request below is a new connection, whichever worker takes it.
        client = OAuthClient(base, client_name=f"matrix row {backend}/{sessions}/{processes}")
        by_name = client.sign_in(NAME, PASSWORD, device_id="OAUTHNAME")
        by_email = client.sign_in(EMAIL.upper(), PASSWORD, device_id="OAUTHMAIL")

        def whoami(token: str) -> Response:
            answer = client.whoami(token)
            return Response(answer.status, answer.headers, answer.body)

        def both_alive(first: str, second: str) -> None:
            for token, device in ((first, "OAUTHNAME"), (second, "OAUTHMAIL")):
                body = assert_json(whoami(token))
                assert (body["user_id"], body["device_id"]) == (f"@{NAME}:localhost", device), body

        every_worker(server, processes, lambda: both_alive(by_name.access_token, by_email.access_token))
        devices = assert_json(server.fetch(f"{API}/devices", token=by_name.access_token))["devices"]
        assert {"OAUTHNAME", "OAUTHMAIL"} <= {d["device_id"] for d in devices}

        # Refresh: a new pair; the new access token works on every worker.
        refreshed = client.refresh(by_name.refresh_token)
        assert refreshed.refresh_token != by_name.refresh_token
        assert refreshed.access_token != by_name.access_token
        every_worker(server, processes, lambda: both_alive(refreshed.access_token, by_email.access_token))

        # Revoking the refresh token ends that session everywhere; the other one lives.
        assert client.revoke(refreshed.refresh_token, "refresh_token").status == 200

        def revoked() -> None:
            body = assert_error(whoami(refreshed.access_token), 401, "M_UNKNOWN_TOKEN")
            assert body["soft_logout"] is False
            assert_json(whoami(by_email.access_token))

        every_worker(server, processes, revoked)
        again = client.token(grant_type="refresh_token", refresh_token=refreshed.refresh_token)
        assert again.status == 400 and again.json["error"] == "invalid_grant", again

        if backend != "ldap":  # the shared test directory is read-only
            # A password reset in the store: the next refresh reads the user and ends the session.
            store = UserStore(backend, server, processes, redis_client, f"{prefix}user:{NAME}")
            store.change(password=record(NAME, "a new password")["password"])
            reset = client.token(grant_type="refresh_token", refresh_token=by_email.refresh_token)
            assert reset.status == 400 and reset.json["error"] == "invalid_grant", reset
            every_worker(server, processes, lambda: assert_error(whoami(by_email.access_token), 401, "M_UNKNOWN_TOKEN"))
    finally:
        server.stop()
        for key in redis_client.scan_iter(f"{prefix}*"):
            redis_client.delete(key)


# -- second factor rows (issue 38) --------------------------------------------------------------
# With [mfa] and [oauth] on: bob must have a second factor, by `[mfa] required = "all"` or by
# the user store's own mark (a users-file record's or Redis hash's `mfa_required`, LDAP's
# `mfa_required_filter`); over each user store and session store, with one and two workers.
MFA_FACTORS = {**OAUTH_FACTORS, "policy": ("all", "mark")}
MFA_MATRIX = [
    ("file", "sqlite", 1, "all"),
    ("file", "redis", 2, "mark"),
    ("redis", "sqlite", 2, "mark"),
    ("redis", "redis", 1, "all"),
    ("ldap", "sqlite", 2, "all"),
    ("ldap", "redis", 1, "mark"),
]
MFA_KEY = "the matrix rows' second-factor key, 32 bytes or more"


def test_the_second_factor_rows_cover_every_pair_of_settings() -> None:
    names = list(MFA_FACTORS)
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        seen = {(row[i], row[j]) for row in MFA_MATRIX}
        assert seen == set(itertools.product(MFA_FACTORS[a], MFA_FACTORS[b])), f"{a} x {b}"


@pytest.mark.parametrize(("backend", "sessions", "processes", "policy"), MFA_MATRIX)
def test_second_factor_required_added_at_sign_in_then_asked_in_every_store(
    tmp_path, request, redis_url, redis_client, backend: str, sessions: str, processes: int, policy: str
) -> None:
    """The password login refused; the OAuth sign-in leads bob to add an app (no token before),
    then asks it; `mfa list` and `mfa reset` on the row's store; refused again after the reset."""
    import re
    from html import unescape

    from tests.oauth_clients.flow import FormBrowser, OAuthClient, pkce
    from tests.support.second_factors import App
    from tests.support.servers import run_py

    prefix = f"matrix-{secrets.token_hex(4)}:"
    slapd = request.getfixturevalue("slapd") if backend == "ldap" else None
    mark = policy == "mark"
    if backend == "redis":
        stored = record(NAME, PASSWORD, "bob-ident")
        fields = {"password": stored["password"], "ident": "bob-ident", **({"mfa_required": "true"} if mark else {})}
        redis_client.hset(f"{prefix}user:{NAME}", mapping=fields)
    users = [*DEFAULT_USERS[:1], record(NAME, PASSWORD, "bob-ident", **({"mfa_required": True} if mark else {}))]
    extra = users_section(backend, redis_url, prefix, slapd)
    if backend == "ldap" and mark:
        extra += f'mfa_required_filter = "(uid={NAME})"\n'
    extra += sessions_section(sessions, redis_url, prefix)
    extra += f'[oauth]\nenabled = true\n[mfa]\nenabled = true\nkey = "{MFA_KEY}"\n'
    extra += f'required = "{"none" if mark else "all"}"\n'
    server = ServerProcess(tmp_path, processes, extra, users=users)
    try:
        refused = server.fetch(f"{API}/login", login_body(type="m.id.user", user=NAME))
        assert "browser" in assert_error(refused, 403, "M_FORBIDDEN")["error"]
        base = f"http://localhost:{server.port}"
        client = OAuthClient(base, client_name=f"mfa row {backend}/{sessions}/{processes}/{policy}")
        apps: list[App] = []

        def sign_in(device: str) -> dict[str, Any]:
            browser = FormBrowser()

            def code() -> str:
                link = re.search(r'href="(otpauth://totp/[^"]+)"', browser.pages[-1].body.decode())
                if link:  # the second step adds the first factor: this app, scanned now
                    apps.append(App.from_uri(unescape(link.group(1))))
                return apps[-1].code()

            verifier, challenge = pkce()
            landed = browser.sign_in(client.authorization_url(device, "st", challenge), NAME, PASSWORD,
                                     client.redirect_uri, steps=8, code=code)
            found = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(landed).query))
            answer = client.token(grant_type="authorization_code", code=found["code"],
                                  redirect_uri=client.redirect_uri, code_verifier=verifier)
            assert answer.status == 200, answer
            return answer.json

        first = sign_in("MFAROWONE")
        assert len(apps) == 1  # added in the second step, before the token
        second = sign_in("MFAROWTWO")
        assert len(apps) == 1  # asked, not added again

        def both_alive() -> None:
            for tokens in (first, second):
                assert_json(server.fetch(f"{API}/account/whoami", token=tokens["access_token"]))

        every_worker(server, processes, both_alive)
        config = str(tmp_path / "homeserver.toml")
        listed = run_py("mfa", "list", NAME, "--config", config)
        assert listed.returncode == 0, listed.stderr
        assert [line.split("\t")[1] for line in listed.stdout.splitlines()] == ["app", "recovery"]
        reset = run_py("mfa", "reset", NAME, "--config", config)
        assert reset.returncode == 0 and reset.stdout.startswith("Removed 2 second factors"), reset
        assert run_py("mfa", "list", NAME, "--config", config).stdout == ""
        again = server.fetch(f"{API}/login", login_body(type="m.id.user", user=NAME))
        assert_error(again, 403, "M_FORBIDDEN")  # must have one still: asked to add it at the next sign-in
    finally:
        server.stop()
        for key in redis_client.scan_iter(f"{prefix}*"):
            redis_client.delete(key)
