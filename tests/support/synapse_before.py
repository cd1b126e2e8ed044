"""A real Synapse "before the move": the pinned Synapse checking its own passwords (a pepper
set, cheap bcrypt), optionally with matrix-synapse-ldap3 against the test slapd and
PostgreSQL as its database, brought into the state a migration meets by its own APIs:

- `root`, an admin; `alice`, whose password NFKC changes (`ﬁ`), with a display name, a
  phone session and a laptop session that asked for a refresh token; `bob` with an e-mail
  address, a session, a logged-out one and an admin's impersonation token; `carol`,
  deactivated by the admin API; `dave`, locked by it, his session kept; `erin`, refreshed
  on two devices, one refresh token spent (its successor's access token used) and one
  superseded (its successor's never used); with LDAP, `grace` from the directory, who
  has no password hash at Synapse.

`make_state` returns what was made (passwords, tokens, devices), so tests read Synapse's
database afterwards and compare. Synapse is stopped by then, as the migration wants it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.synapse import EXTRAS, Synapse, http, synapse_extras
from tests.support.synapse_schema import PSYCOPG2

LDAP3 = next(r for r in EXTRAS if r.startswith("matrix-synapse-ldap3"))
PEPPER = "synapse-pepper-Ünïcode"
PASSWORDS = {
    "root": "root-password",
    "alice": "ﬁsh and chips",  # NFKC: "fish and chips", which logs in too
    "bob": "builder-pw",
    "carol": "carol-pw",
    "dave": "dave-pw",
    "erin": "erin-pw",
}
LDAP_USER, LDAP_PASSWORD = "grace", "grace-pw"  # tests/support/slapd.py's directory


@dataclass
class Session:
    user: str
    device_id: str
    access_token: str
    refresh_token: str | None = None


@dataclass
class BeforeState:
    """What make_state made at Synapse."""

    server_name: str
    pepper: str
    sessions: dict[str, Session] = field(default_factory=dict)  # by a name the tests use
    puppet_token: str = ""  # root acting as bob
    logged_out_token: str = ""
    spent_refresh: str = ""  # erin's phone's first refresh token
    superseded_refresh: str = ""  # erin's tablet's first: its successor's access token never used
    ldap: bool = False


class SynapseBefore(Synapse):
    """A Synapse with its own password login and a pepper; `database` replaces SQLite (a
    `database:` section), `ldap_uri` adds matrix-synapse-ldap3 in simple-bind mode."""

    def __init__(self, folder: Path, *, database: dict[str, Any] | None = None, ldap_uri: str | None = None,
                 extra: dict[str, Any] | None = None, server_name: str = "localhost", port: int | None = None,
                 public_baseurl: str | None = None) -> None:
        self.database = database
        self.ldap_uri = ldap_uri
        self.extra = extra or {}
        super().__init__(folder, server_name, log_level="WARNING", port=port, public_baseurl=public_baseurl)

    def config(self) -> dict[str, Any]:
        config = super().config()
        if self.database is not None:
            config["database"] = self.database
        config["password_config"] = {"enabled": True, "pepper": PEPPER}
        config["bcrypt_rounds"] = 4
        config["background_updates"] = {"sleep_enabled": False}
        if self.ldap_uri:
            config["modules"] = [{
                "module": "ldap_auth_provider.LdapAuthProviderModule",
                "config": {
                    "enabled": True, "uri": self.ldap_uri, "start_tls": False,
                    "base": "ou=people,dc=example,dc=org",
                    "attributes": {"uid": "uid", "mail": "mail", "name": "displayName"},
                },
            }]
        config.update(self.extra)
        return config

    def start(self, timeout: float = 240) -> None:
        needed = [r for r, wanted in ((PSYCOPG2, self.database is not None), (LDAP3, bool(self.ldap_uri))) if wanted]
        synapse_extras(*needed)
        super().start(timeout)

    # -- the client and admin APIs ---------------------------------------------------------

    def call(self, path: str, body: Any = None, token: str | None = None, method: str | None = None,
             expect: int = 200) -> Any:
        status, answer = http(self.url + path, body, token, method)
        assert status == expect, (path, status, answer)
        return answer

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"

    def login(self, user: str, password: str, device_id: str, display_name: str | None = None,
              refresh: bool = False) -> Session:
        body: dict[str, Any] = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                                "password": password, "device_id": device_id}
        if display_name:
            body["initial_device_display_name"] = display_name
        if refresh:
            body["refresh_token"] = True
        answer = self.call("/_matrix/client/v3/login", body)
        assert answer["device_id"] == device_id
        return Session(user, device_id, answer["access_token"], answer.get("refresh_token"))

    def refresh(self, refresh_token: str) -> tuple[str, str]:
        answer = self.call("/_matrix/client/v3/refresh", {"refresh_token": refresh_token})
        return answer["access_token"], answer["refresh_token"]

    def whoami(self, token: str) -> tuple[int, Any]:
        return http(self.url + "/_matrix/client/v3/account/whoami", token=token)


def make_state(synapse: SynapseBefore) -> BeforeState:
    """Bring a started, empty Synapse into the state the module docstring lists."""
    state = BeforeState(synapse.server_name, PEPPER, ldap=bool(synapse.ldap_uri))
    admin = synapse.register("root", PASSWORDS["root"], admin=True)
    for name in ("alice", "bob", "carol", "dave", "erin"):
        synapse.register(name, PASSWORDS[name])
    sessions = state.sessions
    sessions["root"] = synapse.login("root", PASSWORDS["root"], "ROOTDESK", "Admin desk")
    sessions["alice_phone"] = synapse.login("alice", PASSWORDS["alice"], "ALICEPHONE", "Alice's phone")
    # Synapse normalises: the NFKC form of the password is the same password.
    sessions["alice_laptop"] = synapse.login("alice", "fish and chips", "ALICELAPTOP", "Alice's laptop", refresh=True)
    sessions["bob"] = synapse.login("bob", PASSWORDS["bob"], "BOBPHONE")
    old = synapse.login("bob", PASSWORDS["bob"], "BOBOLD")
    synapse.call("/_matrix/client/v3/logout", {}, old.access_token)
    state.logged_out_token = old.access_token
    sessions["dave"] = synapse.login("dave", PASSWORDS["dave"], "DAVEPHONE")
    sessions["carol"] = synapse.login("carol", PASSWORDS["carol"], "CAROLPHONE")
    # erin: on her phone a refresh whose new access token was used (the first refresh token
    # is spent; Synapse deletes it at the next refresh), on her tablet one whose new access
    # token was not (the first is superseded: Synapse still takes it, for a lost answer).
    phone = synapse.login("erin", PASSWORDS["erin"], "ERINPHONE", refresh=True)
    tablet = synapse.login("erin", PASSWORDS["erin"], "ERINTABLET", refresh=True)
    assert phone.refresh_token is not None and tablet.refresh_token is not None
    access, refresh = synapse.refresh(phone.refresh_token)
    assert synapse.whoami(access)[0] == 200
    sessions["erin_phone"] = Session("erin", "ERINPHONE", access, refresh)
    sessions["erin_tablet"] = Session("erin", "ERINTABLET", *synapse.refresh(tablet.refresh_token))
    state.spent_refresh, state.superseded_refresh = phone.refresh_token, tablet.refresh_token
    # The admin API: impersonation, a display name, an address, a lock, a deactivation.
    state.puppet_token = synapse.call(f"/_synapse/admin/v1/users/{synapse.user_id('bob')}/login", {}, admin)[
        "access_token"]
    synapse.call(f"/_matrix/client/v3/profile/{synapse.user_id('alice')}/displayname",
                 {"displayname": "Alice Liddell"}, sessions["alice_phone"].access_token, "PUT")
    synapse.call(f"/_synapse/admin/v2/users/{synapse.user_id('bob')}",
                 {"threepids": [{"medium": "email", "address": "bob@example.org"}]}, admin, "PUT")
    synapse.call(f"/_synapse/admin/v2/users/{synapse.user_id('dave')}", {"locked": True}, admin, "PUT")
    synapse.call(f"/_synapse/admin/v1/deactivate/{synapse.user_id('carol')}", {"erase": False}, admin)
    del sessions["carol"]
    if synapse.ldap_uri:
        sessions["grace"] = synapse.login(LDAP_USER, LDAP_PASSWORD, "GRACEPHONE", "Grace's phone")
    return state
