"""TOML configuration with defaults, `HOMESERVER_<SECTION>__<KEY>` overrides and checks."""

from __future__ import annotations

import logging
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_PREFIX = "HOMESERVER_"
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "homeserver.toml")


@dataclass(frozen=True)
class Field:
    """One config key: its kind, its default and an optional check returning an error text."""

    kind: str  # "str", "int", "float", "bool", "str_list", "str_or_list"
    default: Any
    check: Callable[[Any], str | None] | None = None


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
        "sentinel_password": Field("str", ""),
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
        "base_url": Field("str", "http://localhost:8008", _http_url),
        "server_name": Field("str", "localhost", _non_empty),
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
        "jwt_secret": Field("str", ""),
        # Secrets of before a rotation: their tokens are still accepted; new ones use jwt_secret.
        "previous_jwt_secrets": Field("str_list", [], _secrets),
        "secret_file": Field("str", "jwt.secret", _non_empty),
        "token_lifetime": Field("int", 0, _range(0)),
        "bcrypt_rounds": Field("int", 12, _range(4, 31)),
        # Threads checking passwords; 0 means one per CPU core.
        "bcrypt_workers": Field("int", 0, _range(0, 256)),
        # Password checks running or waiting at once; more logins get 429 at once.
        "max_pending_logins": Field("int", 64, _range(1)),
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
        "base": Field("str", ""),
        # Extra filter ANDed with the name match, e.g. "(objectClass=inetOrgPerson)".
        "filter": Field("str", ""),
        "bind_dn": Field("str", ""),
        "bind_password": Field("str", ""),
        "bind_password_file": Field("str", ""),
        "mode": Field("str", "hash", _one_of("hash", "bind")),
        "timeout": Field("float", 5.0, _range(0.1, 300)),
        "start_tls": Field("bool", False),
        "ca_file": Field("str", ""),
        "tls_require_cert": Field("bool", True),
        "pool_size": Field("int", 4, _range(1, 64)),
    },
    "backend.ldap.attributes": {
        "name": Field("str_or_list", "uid"),
        "display_name": Field("str_or_list", ["displayName", "cn"]),
        "ident": Field("str_or_list", "entryUUID"),
        "avatar_url": Field("str_or_list", "labeledURI"),
        "password": Field("str_or_list", "userPassword"),
    },
    "sessions": {
        "store": Field("str", "sqlite", _one_of("sqlite", "redis")),
        # Seconds between last-seen writes of one session (per process): not every request writes.
        "touch_interval": Field("float", 60.0, _range(0)),
        # Seconds between sweeps that end the sessions of users gone from the user store.
        "sweep_interval": Field("float", 3600.0, _positive),
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
    "metrics": {
        "enabled": Field("bool", False),
        # 0 serves /metrics on the main listener; another port serves it there instead
        # (worker i of [server] processes uses port + i).
        "port": Field("int", 0, _range(0, 65535)),
        "host": Field("str", "127.0.0.1", _non_empty),
    },
}


@dataclass
class Config:
    """Validated configuration: `config.section("server")["port"]`."""

    sections: dict[str, dict[str, Any]]
    path: str | None = None
    config_dir: str = field(default_factory=os.getcwd)

    def section(self, name: str) -> dict[str, Any]:
        return self.sections[name]

    def get(self, section: str, key: str) -> Any:
        return self.sections[section][key]

    def resolve_path(self, value: str) -> str:
        """Return a path from the config, taken relative to the config file's folder."""
        return value if os.path.isabs(value) else os.path.join(self.config_dir, value)


def _type_error(where: str, kind: str, value: Any) -> ConfigError:
    names = {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str_list": "a list of strings",
        "str_or_list": "a string or a list of strings",
    }
    return ConfigError(f"{where}: expected {names[kind]}, got {value!r}")


def _check_type(where: str, kind: str, value: Any) -> Any:
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in ("str_list", "str_or_list") and isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            return list(value)
    if kind == "str_or_list" and isinstance(value, str):
        return value
    raise _type_error(where, kind, value)


def _parse_env(where: str, kind: str, raw: str) -> Any:
    """Turn an environment string into the key's kind."""
    try:
        if kind == "str":
            return raw
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "str_or_list" and not raw.lstrip().startswith("["):
            return raw
        return tomllib.loads(f"v = {raw}")["v"]
    except (ValueError, tomllib.TOMLDecodeError):
        raise _type_error(where, kind, raw) from None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Split a parsed TOML document into {dotted section: {key: value}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.setdefault(name, {})
            for sub, items in _flatten(value, name).items():
                out.setdefault(sub, {}).update(items)
        else:
            out.setdefault(prefix, {})[key] = value
    return out


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if len(parts) < 2 or not all(parts):
            logger.warning("ignoring environment variable %s: expected HOMESERVER_<SECTION>__<KEY>", name)
            continue
        out.setdefault(".".join(parts[:-1]), {})[parts[-1]] = raw
    return out


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Read the TOML file (the default when `path` is None), then env, then `overrides`."""
    path = os.path.abspath(path or DEFAULT_CONFIG)
    try:
        with open(path, "rb") as fh:
            document = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: malformed TOML: {exc}") from None
    return build_config(
        document,
        path=path,
        environ=os.environ if environ is None else environ,
        overrides=overrides,
    )


def build_config(
    document: Mapping[str, Any],
    *,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Validate a parsed document (plus env and overrides) against the schema."""
    given = _flatten(document)
    sections: dict[str, dict[str, Any]] = {
        name: {key: f.default for key, f in fields.items()} for name, fields in SCHEMA.items()
    }

    def apply(section: str, key: str, value: Any, *, from_env: bool) -> None:
        where = f"{section}.{key}" if section else key
        fields = SCHEMA.get(section)
        if fields is None or key not in fields:
            logger.warning("unknown config key %s (ignored)", where)
            return
        spec = fields[key]
        if from_env:
            value = _parse_env(where, spec.kind, value)
        value = _check_type(where, spec.kind, value)
        if spec.check is not None:
            problem = spec.check(value)
            if problem:
                raise ConfigError(f"{where}: {problem} (got {value!r})")
        sections[section][key] = value

    for section, items in given.items():
        for key, value in items.items():
            apply(section, key, value, from_env=False)
    for section, items in _env_overrides(environ or {}).items():
        for key, raw in items.items():
            apply(section, key, raw, from_env=True)
    for section, items in (overrides or {}).items():
        for key, value in items.items():
            if value is not None:
                apply(section, key, value, from_env=False)

    secret = sections["auth"]["jwt_secret"]
    if secret and len(secret.encode("utf-8")) < 32:
        raise ConfigError("auth.jwt_secret: must be at least 32 bytes (leave it empty to generate one)")

    config_dir = os.path.dirname(path) if path else os.getcwd()
    return Config(sections=sections, path=path, config_dir=config_dir)
