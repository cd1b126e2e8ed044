"""TOML configuration with defaults, `HOMESERVER_<SECTION>__<KEY>` overrides and checks."""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.base import resolve_path
from homeserver.config_schema import SCHEMA
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_PREFIX = "HOMESERVER_"
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "homeserver.toml")


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
        return resolve_path(value, self.config_dir)


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
    for section, overridden in (overrides or {}).items():
        for key, value in overridden.items():
            if value is not None:
                apply(section, key, value, from_env=False)

    secret = sections["auth"]["jwt_secret"]
    if secret and len(secret.encode("utf-8")) < 32:
        raise ConfigError("auth.jwt_secret: must be at least 32 bytes (leave it empty to generate one)")

    config_dir = os.path.dirname(path) if path else os.getcwd()
    return Config(sections=sections, path=path, config_dir=config_dir)
