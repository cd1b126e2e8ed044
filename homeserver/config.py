"""TOML configuration with defaults, `HOMESERVER_<SECTION>__<KEY>` overrides and checks."""

from __future__ import annotations

import logging
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.base import resolve_path
from homeserver.config_schema import SCHEMA
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_PREFIX = "HOMESERVER_"
# Files the server writes (the session store, a generated secret) go to the state directory
# systemd's StateDirectory= names in this variable, when it is set (conf/homeserver.service).
STATE_DIRECTORY_ENV = "STATE_DIRECTORY"
# Keys naming files the server writes: relative ones are taken from the state directory.
WRITTEN_FILES = (("sessions.sqlite", "path"), ("auth", "secret_file"), ("mfa", "key_file"))
# The connection keys [sessions.redis] takes from [backend.redis] when it has no url of its own.
REDIS_CONNECTION_KEYS = ("url", "mode", "sentinels", "service_name", "sentinel_password", "cluster_nodes")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "homeserver.toml")


@dataclass
class Config:
    """Validated configuration: `config.section("server")["port"]`."""

    sections: dict[str, dict[str, Any]]
    path: str | None = None
    config_dir: str = field(default_factory=os.getcwd)
    # Where relative paths of files the server writes are taken from: $STATE_DIRECTORY
    # when systemd sets it, else the config file's folder.
    state_dir: str = field(default_factory=os.getcwd)
    # True when [server] base_url was not configured: it follows the host and the port
    # actually listened on (see `follow_listener`).
    base_url_follows: bool = False
    # Warnings found while reading (unknown keys, misspelt environment variables), logged
    # by `log_warnings` once logging is set up, so they go out in the configured format.
    warnings: list[str] = field(default_factory=list)

    def section(self, name: str) -> dict[str, Any]:
        return self.sections[name]

    def get(self, section: str, key: str) -> Any:
        return self.sections[section][key]

    def resolve_path(self, value: str) -> str:
        """Return a path from the config, taken relative to the config file's folder."""
        return resolve_path(value, self.config_dir)

    def log_warnings(self) -> None:
        """Log the warnings found while reading the config (once; call after logging is set up)."""
        for text in self.warnings:
            logger.warning("%s", text)
        self.warnings = []

    def follow_listener(self, port: int) -> None:
        """With no configured base_url, point it at the port actually listened on (`--port`, port 0)."""
        if self.base_url_follows:
            self.sections["server"]["base_url"] = default_base_url(self.sections["server"]["host"], port)


def default_base_url(host: str, port: int) -> str:
    """The base_url when none is configured: this host and port, as a client on it reaches them.

    A loopback address becomes `localhost`; a wildcard (every address) this machine's name.
    """
    if host in ("127.0.0.1", "::1", "localhost") or host.startswith("127."):
        name = "localhost"
    elif host in ("0.0.0.0", "::", "*", ""):
        name = socket.gethostname() or "localhost"
    elif ":" in host:
        name = f"[{host}]"
    else:
        name = host
    return f"http://{name}:{port}"


def state_directory(environ: Mapping[str, str]) -> str | None:
    """The first directory in $STATE_DIRECTORY (systemd lists several separated by colons)."""
    value = environ.get(STATE_DIRECTORY_ENV, "")
    first = value.split(":", 1)[0]
    return first or None


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list"}


def _shown(value: Any, secret: bool) -> str:
    """A value as an error may show it: a secret's only by its type, a URL's without its password."""
    if secret:
        return _TYPE_NAMES.get(type(value), "a table")
    if isinstance(value, str) and "://" in value:
        value = _without_password(value)
    return repr(value)


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}{sep}{user}{':***' if ':' in userinfo else ''}@{host}{slash}{path}"


def _type_error(where: str, kind: str, value: Any, secret: bool = False) -> ConfigError:
    names = {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str_list": "a list of strings",
        "str_or_list": "a string or a list of strings",
    }
    return ConfigError(f"{where}: expected {names[kind]}, got {_shown(value, secret)}")


def _check_type(where: str, kind: str, value: Any, secret: bool = False) -> Any:
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
    raise _type_error(where, kind, value, secret)


def _parse_env(where: str, kind: str, raw: str, secret: bool = False) -> Any:
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
        raise _type_error(where, kind, raw, secret) from None


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


def _env_overrides(environ: Mapping[str, str], warnings: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if len(parts) < 2 or not all(parts):
            hint = _env_hint(name)
            warnings.append(f"ignoring environment variable {name}: expected HOMESERVER_<SECTION>__<KEY>{hint}")
            continue
        out.setdefault(".".join(parts[:-1]), {})[parts[-1]] = raw
    return out


def _env_hint(name: str) -> str:
    """For a known key spelt with one underscore (HOMESERVER_SERVER_PORT), its right spelling."""
    wanted = name[len(ENV_PREFIX):].lower().replace("__", "_")
    for section, fields in SCHEMA.items():
        for key in fields:
            if f"{section}_{key}".replace(".", "_") == wanted:
                spelt = f"{ENV_PREFIX}{section.replace('.', '__')}__{key}".upper()
                return f" (two underscores between section and key: {spelt})"
    return ""


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    defer_warnings: bool = False,
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
        defer_warnings=defer_warnings,
    )


def build_config(
    document: Mapping[str, Any],
    *,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    defer_warnings: bool = False,
) -> Config:
    """Validate a parsed document (plus env and overrides) against the schema.

    Warnings (unknown keys, misspelt environment variables) are logged at once, unless
    `defer_warnings`: then they wait in `Config.warnings` until logging is set up.
    """
    given = _flatten(document)
    sections: dict[str, dict[str, Any]] = {
        name: {key: f.default for key, f in fields.items()} for name, fields in SCHEMA.items()
    }
    environ = environ or {}
    warnings: list[str] = []
    # Every (section, key) the file, the environment or an override set.
    explicit: set[tuple[str, str]] = set()

    def apply(section: str, key: str, value: Any, *, from_env: bool) -> None:
        where = f"{section}.{key}" if section else key
        fields = SCHEMA.get(section)
        if fields is None or key not in fields:
            warnings.append(f"unknown config key {where} (ignored)")
            return
        spec = fields[key]
        if from_env:
            value = _parse_env(where, spec.kind, value, spec.secret)
        value = _check_type(where, spec.kind, value, spec.secret)
        if spec.check is not None:
            problem = spec.check(value)
            if problem:
                got = "" if spec.secret else f" (got {_shown(value, False)})"
                raise ConfigError(f"{where}: {problem}{got}")
        sections[section][key] = value
        explicit.add((section, key))

    for section, items in given.items():
        for key, value in items.items():
            apply(section, key, value, from_env=False)
    for section, items in _env_overrides(environ, warnings).items():
        for key, raw in items.items():
            apply(section, key, raw, from_env=True)
    for section, overridden in (overrides or {}).items():
        for key, value in overridden.items():
            if value is not None:
                apply(section, key, value, from_env=False)

    secret = sections["auth"]["jwt_secret"]
    if secret and len(secret.encode("utf-8")) < 32:
        raise ConfigError("auth.jwt_secret: must be at least 32 bytes (leave it empty to generate one)")

    _sessions_redis_defaults(sections, explicit)
    config_dir = os.path.dirname(path) if path else os.getcwd()
    state_dir = state_directory(environ) or config_dir
    for section, key in WRITTEN_FILES:
        value = sections[section][key]
        if not os.path.isabs(value):
            sections[section][key] = os.path.join(state_dir, value)
    server = sections["server"]
    follows = not server["base_url"]
    if follows:
        server["base_url"] = default_base_url(server["host"], server["port"])
    config = Config(
        sections=sections, path=path, config_dir=config_dir, state_dir=state_dir, base_url_follows=follows,
        warnings=warnings,
    )
    if not defer_warnings:
        config.log_warnings()
    return config


def _sessions_redis_defaults(sections: dict[str, dict[str, Any]], explicit: set[tuple[str, str]]) -> None:
    """`[sessions] store = "redis"` without its own url: the user backend's Redis, or refuse.

    Never a silent 127.0.0.1:6379 while the users are on another Redis.
    """
    if sections["sessions"]["store"] != "redis" or ("sessions.redis", "url") in explicit:
        return
    if sections["backend"]["type"] != "redis":
        raise ConfigError(
            'sessions.redis.url: must be set when [sessions] store = "redis" '
            f"(the users are not on Redis: backend.type = {sections['backend']['type']!r})"
        )
    for key in REDIS_CONNECTION_KEYS:
        if ("sessions.redis", key) not in explicit:
            sections["sessions.redis"][key] = sections["backend.redis"][key]
