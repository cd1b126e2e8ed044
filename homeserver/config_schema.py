"""Every config key: its kind, its default and its check (the schema `homeserver.config` applies)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    """One config key: its kind, its default and an optional check returning an error text."""

    kind: str  # "str", "int", "float", "bool", "str_list", "str_or_list"
    default: Any
    check: Callable[[Any], str | None] | None = None
    # A secret's value is never shown in an error (errors go to logs and terminals).
    secret: bool = False


def _range(lo: float, hi: float | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value < lo or (hi is not None and value > hi):
            return f"must be between {lo} and {hi}" if hi is not None else f"must be at least {lo}"
        return None

    return check


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def _non_empty(value: Any) -> str | None:
    return None if value else "must not be empty"


def _http_url(value: Any) -> str | None:
    return None if value.startswith(("http://", "https://")) else "must start with http:// or https://"


def _optional_http_url(value: Any) -> str | None:
    return None if not value else _http_url(value)


# Matrix server names (appendices, "Server Name"): hostname [ ":" port ], the hostname an IPv4
# address, an IPv6 address in brackets, or a DNS name of letters, digits, "-" and ".".
_SERVER_NAME = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.-]{1,255})(?::(?P<port>[0-9]{1,5}))?")


def server_name_problem(value: str) -> str | None:
    """Why `value` is no Matrix server name, or None when it is one."""
    match = _SERVER_NAME.fullmatch(value)
    if match is None:
        return "must be a Matrix server name: a DNS name, an IPv4 address or [an IPv6 address], optionally with :port"
    host, port = match.group("host"), match.group("port")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address"
    if port is not None and not 0 < int(port) <= 65535:
        return f"port {port} is not between 1 and 65535"
    return None


def _server_name(value: Any) -> str | None:
    return server_name_problem(value)


def _cidrs(value: Any) -> str | None:
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            return f"{item!r} is not an IP address or CIDR network"
    return None


def _secrets(value: Any) -> str | None:
    for index, item in enumerate(value):
        if len(item.encode("utf-8")) < 32:
            return f"entry {index} must be at least 32 bytes"
    return None


def _empty_or_secret(value: Any) -> str | None:
    if not value or len(value.encode("utf-8")) >= 32:
        return None
    return "must be at least 32 bytes (leave it empty to generate one)"


def _positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _redis_url(value: Any) -> str | None:
    ok = value.startswith(("redis://", "rediss://", "unix://"))
    return None if ok else "must start with redis://, rediss:// or unix://"


def _redis_fields(key_prefix: str) -> dict[str, Field]:
    """The connection keys of a Redis section (the user backend's, the session store's)."""
    return {
        "url": Field("str", "redis://127.0.0.1:6379/0", _redis_url),
        "key_prefix": Field("str", key_prefix),
        "mode": Field("str", "standalone", _one_of("standalone", "sentinel", "cluster")),
        "sentinels": Field("str_list", []),
        "service_name": Field("str", "mymaster"),
        "sentinel_password": Field("str", "", secret=True),
        "cluster_nodes": Field("str_list", []),
        "connect_timeout": Field("float", 1.0, _range(0.05, 60)),
        "socket_timeout": Field("float", 1.0, _range(0.05, 60)),
        "retries": Field("int", 1, _range(0, 10)),
        "max_connections": Field("int", 100, _range(1, 10000)),
        "health_check_interval": Field("int", 0, _range(0)),
        "retry_after": Field("int", 5, _range(1, 3600)),
    }


# Every known section and key. Backend sections list their keys here too, so a config
# file that carries a section for another backend raises no unknown-key warnings.
SCHEMA: dict[str, dict[str, Field]] = {
    "server": {
        "host": Field("str", "127.0.0.1", _non_empty),
        "port": Field("int", 8008, _range(0, 65535)),
        # "" (the default): follow host and the port actually listened on (homeserver.config).
        "base_url": Field("str", "", _optional_http_url),
        "server_name": Field("str", "localhost", _server_name),
        "identity_server_url": Field("str", "https://vector.im", _optional_http_url),
        "processes": Field("int", 1, _range(1, 256)),
        "max_body_size": Field("int", 65536, _range(1024)),
        # Peers (IPs or CIDRs) whose X-Forwarded-For names the real client address.
        "trusted_proxies": Field("str_list", [], _cidrs),
        # Seconds to let in-flight requests finish on SIGTERM before connections are cut.
        "drain_timeout": Field("float", 10.0, _range(0)),
        # Seconds a connection may sit idle (or take to send its headers) before it is closed.
        "idle_timeout": Field("float", 60.0, _positive),
        # Seconds a request may take to send its body.
        "body_timeout": Field("float", 30.0, _positive),
        # "auto": uvloop when it is installed (about 10 % more requests per core), else asyncio.
        "event_loop": Field("str", "auto", _one_of("auto", "asyncio", "uvloop")),
    },
    "support": {
        "email_address": Field("str", "admin@localhost", _non_empty),
        "matrix_id": Field("str", "@admin:localhost", _non_empty),
        "role": Field("str", "m.role.admin", _non_empty),
    },
    "auth": {
        "jwt_secret": Field("str", "", secret=True),
        # Secrets of before a rotation: their tokens are still accepted; new ones use jwt_secret.
        "previous_jwt_secrets": Field("str_list", [], _secrets, secret=True),
        "secret_file": Field("str", "jwt.secret", _non_empty),
        "token_lifetime": Field("int", 0, _range(0)),
        # Seconds an access token that comes with a refresh token lives (a password login asking
        # refresh_token: true, POST /refresh, the refresh tokens moved from a Synapse).
        "refreshable_token_lifetime": Field("int", 300, _range(30, 86400)),
        "bcrypt_rounds": Field("int", 12, _range(4, 31)),
        # Threads checking passwords; 0 means one per CPU core.
        "bcrypt_workers": Field("int", 0, _range(0, 256)),
        # Password checks running or waiting at once; more logins get 429 at once.
        "max_pending_logins": Field("int", 64, _range(1)),
        # Synapse's password_config.pepper, for the password hashes moved from a Synapse
        # (`migrate-synapse run`), or a file holding it; one of the two, not both.
        "synapse_pepper": Field("str", "", secret=True),
        "synapse_pepper_file": Field("str", ""),
    },
    "backend": {
        "type": Field("str", "file", _non_empty),
    },
    "backend.file": {
        "path": Field("str", "users.json", _non_empty),
        # Seconds between checks of the file for changes; 0 turns polling off (SIGHUP still reloads).
        "reload_interval": Field("float", 5.0, _range(0)),
        # A password that is not the hex text of a bcrypt hash stops start-up (naming the
        # record); false loads it, and its logins answer 500 as with Redis and LDAP.
        "check_passwords": Field("bool", True),
    },
    "backend.redis": {
        **_redis_fields("homeserver:user:"),
        # Login by e-mail: `<email_key_prefix><address>` is the set of names holding it.
        "email_key_prefix": Field("str", "homeserver:email:"),
    },
    "backend.ldap": {
        # One URI or a list tried in order: ldap://host[:port] or ldaps://host[:port].
        "uri": Field("str_or_list", "ldap://localhost:389", _non_empty),
        # One DN or a list searched in order: the first with a match answers.
        "base": Field("str_or_list", ""),
        # Extra filter ANDed with the name match, e.g. "(objectClass=inetOrgPerson)".
        "filter": Field("str", ""),
        "bind_dn": Field("str", ""),
        "bind_password": Field("str", "", secret=True),
        "bind_password_file": Field("str", ""),
        "mode": Field("str", "hash", _one_of("hash", "bind")),
        "timeout": Field("float", 5.0, _range(0.1, 300)),
        "start_tls": Field("bool", False),
        "ca_file": Field("str", ""),
        "tls_require_cert": Field("bool", True),
        "pool_size": Field("int", 4, _range(1, 64)),
        # Active Directory: DOMAIN\user matches sAMAccountName, user@domain userPrincipalName.
        "active_directory": Field("bool", False),
        # Hand out lower-cased user IDs (so Alice and alice are one Matrix user).
        "lowercase_user_ids": Field("bool", False),
        # How the ident attribute's value is shown after the display name: " ({ident})"
        # with attributes.ident = "uid" gives "Alice Liddell (alice)".
        "ident_template": Field("str", "{ident}"),
        # Entries matching this filter are locked (M_USER_LOCKED; their sessions stay). Empty:
        # the default for the directory (see README "Account state"); "(!(objectClass=*))"
        # turns locking off.
        "locked_filter": Field("str", ""),
        # With active_directory: also lock accounts locked out by failed logons (lockoutTime).
        "locked_out_is_locked": Field("bool", False),
        # Entries matching this filter are admins (their tokens carry urn:synapse:admin:*),
        # e.g. "(memberOf=cn=matrix-admins,ou=groups,dc=example,dc=org)". Empty: none.
        "admin_filter": Field("str", ""),
        # Entries matching this filter must have a second factor ([mfa]). Empty: none.
        "mfa_required_filter": Field("str", ""),
    },
    "backend.ldap.attributes": {
        "name": Field("str_or_list", "uid"),
        "display_name": Field("str_or_list", ["displayName", "cn"]),
        "ident": Field("str_or_list", "entryUUID"),
        "avatar_url": Field("str_or_list", "labeledURI"),
        "password": Field("str_or_list", "userPassword"),
        "email": Field("str_or_list", "mail"),
    },
    "sessions": {
        "store": Field("str", "sqlite", _one_of("sqlite", "redis")),
        # Seconds between last-seen writes of one session (per process): not every request writes.
        "touch_interval": Field("float", 60.0, _range(0)),
        # Seconds between sweeps that end the sessions of users gone from the user store.
        "sweep_interval": Field("float", 3600.0, _positive),
        # A changed password ends the sessions opened with the old one (a replaced account
        # always does); false keeps them across password rotations.
        "end_on_password_change": Field("bool", True),
    },
    "sessions.sqlite": {
        "path": Field("str", "sessions.db", _non_empty),
        # Seconds a write may wait for the database (another process's write) before 503.
        "timeout": Field("float", 2.0, _range(0.05, 60)),
        # Seconds an ended session is remembered (its token is told soft_logout false).
        "keep_ended": Field("float", 30 * 86400.0, _range(0)),
    },
    "sessions.redis": {
        **_redis_fields("homeserver:session:"),
        # Seconds an ended session is remembered (its token is told soft_logout false).
        "keep_ended": Field("float", 30 * 86400.0, _range(0)),
    },
    "logging": {
        "level": Field("str", "INFO", _one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
        "format": Field("str", "text", _one_of("text", "json")),
    },
    "rate_limit": {
        "enabled": Field("bool", True),
        # Token buckets as Synapse's rc_login: refill per second, and the burst allowed.
        "address_per_second": Field("float", 0.17, _positive),
        "address_burst": Field("int", 3, _range(1)),
        "account_per_second": Field("float", 0.17, _positive),
        "account_burst": Field("int", 3, _range(1)),
        "failed_attempts_per_second": Field("float", 0.17, _positive),
        "failed_attempts_burst": Field("int", 3, _range(1)),
        # Keep the buckets in the session store, shared by every worker and server on it.
        "shared": Field("bool", True),
        # Buckets kept per limit; past that the least recently used is forgotten.
        "max_entries": Field("int", 100_000, _range(100)),
    },
    "delegation": {
        # Be the authentication service of a Synapse (its `matrix_authentication_service`).
        "enabled": Field("bool", False),
        # Synapse's client listener, where its /_synapse/mas/ API answers.
        "synapse_url": Field("str", "", _optional_http_url),
        # The secret shared with Synapse (its matrix_authentication_service.secret), or a file holding it.
        "secret": Field("str", "", secret=True),
        "secret_file": Field("str", ""),
        # User names whose tokens carry urn:synapse:admin:* (Synapse admins).
        "admins": Field("str_list", []),
        # Seconds one call to Synapse may take (connect included).
        "timeout": Field("float", 5.0, _range(0.1, 120)),
        # Seconds between attempts to tell Synapse about sessions that ended while it was away.
        "retry_interval": Field("float", 5.0, _range(0.1, 3600)),
        # Seconds between sweeps of the whole user store (one process sweeps): every user
        # provisioned at Synapse, leavers signed out and deactivated, returners reactivated.
        # 0 turns them off (then [sessions] sweep_interval's sweep ends leavers' sessions).
        "sync_interval": Field("float", 900.0, _range(0, 7 * 86400)),
        # Seconds a user provisioned at Synapse must have been missing from the user store
        # before a sweep deactivates them there; 0: the first sweep that misses them.
        "deactivate_after": Field("float", 86400.0, _range(0)),
    },
    "oauth": {
        # Serve the Matrix OAuth 2.0 API (docs/oauth.md) beside password login.
        "enabled": Field("bool", False),
        # Seconds an OAuth access token lives; clients refresh it with their refresh token.
        "access_token_lifetime": Field("int", 300, _range(1, 86400)),
        # Seconds the codes of a device sign-in (RFC 8628) live, for the person to approve it.
        "device_code_lifetime": Field("int", 900, _range(10, 3600)),
    },
    "mfa": {
        # Second factors (docs/mfa.md): authenticator apps, passkeys and recovery codes, asked
        # at every browser sign-in of a person who has one. Off: nothing changes.
        "enabled": Field("bool", False),
        # "all": everyone must have one (led to add it at their next browser sign-in).
        "required": Field("str", "none", _one_of("none", "all")),
        # The key sealing authenticator-app secrets (AES-256-GCM), at least 32 bytes; empty:
        # generated on first start and kept in key_file, as [auth] jwt_secret / secret_file.
        "key": Field("str", "", _empty_or_secret, secret=True),
        "key_file": Field("str", "mfa.key", _non_empty),
        # Keys of before a rotation: what they sealed still opens; new secrets use the key.
        "previous_keys": Field("str_list", [], _secrets, secret=True),
        # The name authenticator apps show beside the account; empty: [server] server_name.
        "issuer": Field("str", ""),
        # Wrong codes per person, over every process on the session store (token bucket).
        "failed_codes_per_second": Field("float", 0.017, _positive),
        "failed_codes_burst": Field("int", 5, _range(1)),
    },
    "metrics": {
        "enabled": Field("bool", False),
        # 0 serves /metrics on the main listener; another port serves it there instead
        # (worker i of [server] processes uses port + i).
        "port": Field("int", 0, _range(0, 65535)),
        "host": Field("str", "127.0.0.1", _non_empty),
    },
}
