"""Synapse's `homeserver.yaml`: what moving a Synapse here needs from it, read as Synapse reads it.

Only the keys the migration looks at are kept, each with Synapse's own default and its own
way of taking the value (`synapse/config/*.py` of 1.163): `enable_registration` goes
through strtobool, most flags are plain truthiness, `password_config.enabled` may be
"only_for_reauth". Several files (or a folder of `*.yaml`, as `synapse -c DIR`) merge at
the top level, later ones winning, as Synapse merges them.

The database is what `database:` (or `databases:`, the one holding the `main` data store,
or the old `database_path`) names: `sqlite3` with `args.database`, or `psycopg2` with args
Synapse hands to `psycopg2.connect`, that is to libpq as connection keywords.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The module names matrix-synapse-ldap3 is configured under: `modules:` (since 0.2) and the
# older `password_providers:` (Synapse's own old name for it included).
LDAP3_MODULES = frozenset({
    "ldap_auth_provider.LdapAuthProviderModule",
    "ldap_auth_provider.LdapAuthProvider",
    "synapse.util.ldap_auth_provider.LdapAuthProvider",
})


class SynapseConfigError(Exception):
    """Synapse's config cannot be read or is not one Synapse would start with: one line."""


@dataclass(frozen=True)
class DatabaseSettings:
    """Where Synapse's main data store is. `postgres` holds libpq keywords (as psycopg2 gets
    them: `database` already renamed `dbname`, `cp_*` pool options dropped); `dsn`, a
    connection string given as `args.dsn`, which the keywords override."""

    engine: str  # "sqlite3" or "psycopg2", as Synapse names them
    sqlite_path: str = ""
    postgres: Mapping[str, str] = field(default_factory=dict, repr=False)
    dsn: str = field(default="", repr=False)

    def describe(self) -> str:
        """Where the database is, for messages: never the password."""
        if self.engine == "sqlite3":
            return f"the SQLite database {self.sqlite_path}"
        where = self.postgres.get("host") or "the default host"
        if "port" in self.postgres:
            where += f" port {self.postgres['port']}"
        name = self.postgres.get("dbname") or "the default database"
        return f"the PostgreSQL database {name} on {where}" + (" (and args.dsn)" if self.dsn else "")


@dataclass(frozen=True)
class OidcProvider:
    idp_id: str  # as Synapse stores it in user_external_ids ("oidc" or "oidc-<id>")
    issuer: str


@dataclass(frozen=True)
class SynapseConfig:
    """The keys of Synapse's config the migration reads. `database` is None when the config
    names no database this module can read; `database_problem` says why."""

    paths: tuple[str, ...]
    server_name: str
    database: DatabaseSettings | None
    database_problem: str | None = None
    allow_guest_access: bool = False
    enable_registration: bool = False
    registration_captcha: bool = False
    registration_requires_token: bool = False
    # password_config: enabled (True, False or "only_for_reauth"), localdb_enabled, pepper
    password_enabled: bool | str = True
    password_localdb: bool = True
    pepper: str = field(default="", repr=False)
    bcrypt_rounds: int = 12
    oidc_providers: tuple[OidcProvider, ...] = ()
    saml2: bool = False
    cas: bool = False
    jwt: bool = False
    password_providers: tuple[str, ...] = ()  # module names, ldap_config included
    modules: tuple[str, ...] = ()
    user_consent: bool = False
    login_via_existing_session: bool = False
    enable_3pid_changes: bool | None = None  # None: not set (Synapse's default follows delegation)
    # Settings Synapse refuses under delegation that are set: their key names.
    lifetimes: tuple[str, ...] = ()
    delegated: bool = False  # matrix_authentication_service (or msc3861) already on
    app_service_config_files: tuple[str, ...] = ()

    @property
    def ldap3(self) -> bool:
        """matrix-synapse-ldap3 is configured, as a module or a password provider."""
        return bool(LDAP3_MODULES.intersection(self.password_providers + self.modules))

    @property
    def password_login(self) -> bool:
        """Synapse's users log in with passwords it checks (its own hashes or a provider's)."""
        return self.password_enabled is True


def _strtobool(where: str, value: Any) -> bool:
    """Synapse's strtobool(str(value)) (enable_registration)."""
    text = str(value).strip().lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise SynapseConfigError(f"{where}: invalid truth value {value!r}")


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SynapseConfigError(f"{key}: expected a mapping")
    return value


def _enabled(section: Mapping[str, Any], default: bool) -> bool:
    return bool(section.get("enabled", default)) if section else False


def yaml_files(paths: Sequence[str]) -> list[str]:
    """The files Synapse reads for `-c PATH ...`: a folder stands for its `*.yaml`, sorted."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".yaml"))
        else:
            files.append(path)
    if not files:
        raise SynapseConfigError(f"no Synapse config files in {', '.join(paths)}")
    return files


def read_yaml(paths: Sequence[str]) -> dict[str, Any]:
    """The files merged at the top level, later ones winning (Synapse's rule)."""
    import yaml  # PyYAML: only the migration needs it

    merged: dict[str, Any] = {}
    for path in yaml_files(paths):
        try:
            with open(path, encoding="utf-8") as fh:
                document = yaml.safe_load(fh)
        except OSError as exc:
            raise SynapseConfigError(f"Synapse config {path}: cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise SynapseConfigError(f"Synapse config {path}: not UTF-8 text") from None
        except yaml.YAMLError as exc:
            # Only where and what: the line itself (a secret, perhaps) stays out of the message.
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "malformed"
            raise SynapseConfigError(f"Synapse config {path}: not valid YAML{where}: {problem}") from None
        if document is None:
            continue
        if not isinstance(document, dict):
            raise SynapseConfigError(f"Synapse config {path}: expected a mapping at the top")
        merged.update(document)
    return merged


def load_synapse_config(paths: str | Sequence[str]) -> SynapseConfig:
    """Read Synapse's config from `paths` (a file, a folder, or several); SynapseConfigError
    names the file and the key when it cannot be read or Synapse would refuse it."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    return parse_synapse_config(read_yaml(paths), paths=paths)


def parse_synapse_config(config: Mapping[str, Any], *, paths: Sequence[str] = ()) -> SynapseConfig:
    """The migration's view of a parsed config; relative SQLite paths are taken from the
    first config file's folder (Synapse takes them from its working directory)."""
    server_name = config.get("server_name")
    if not isinstance(server_name, str) or not server_name:
        raise SynapseConfigError("server_name: missing (Synapse's config must name its server)")
    base = os.path.dirname(os.path.abspath(paths[0])) if paths else os.getcwd()
    try:
        database, database_problem = database_settings(config, base), None
    except SynapseConfigError as exc:
        database, database_problem = None, str(exc)
    passwords = _section(config, "password_config")
    enabled = passwords.get("enabled", True)
    password_enabled: bool | str = enabled if enabled == "only_for_reauth" else bool(enabled)
    pepper = passwords.get("pepper") or ""
    if not isinstance(pepper, str):
        raise SynapseConfigError("password_config.pepper: expected a string")
    rounds = config.get("bcrypt_rounds", 12)
    if not isinstance(rounds, int) or isinstance(rounds, bool):
        raise SynapseConfigError(f"bcrypt_rounds: expected an integer, got {rounds!r}")
    captcha = config.get("enable_registration_captcha", False)
    changes = config.get("enable_3pid_changes")
    return SynapseConfig(
        paths=tuple(paths),
        server_name=server_name,
        database=database,
        database_problem=database_problem,
        allow_guest_access=bool(config.get("allow_guest_access", False)),
        enable_registration=_strtobool("enable_registration", config.get("enable_registration", False)),
        registration_captcha=bool(captcha),
        registration_requires_token=bool(config.get("registration_requires_token", False)),
        password_enabled=password_enabled,
        password_localdb=bool(passwords.get("localdb_enabled", True)),
        pepper=pepper,
        bcrypt_rounds=rounds,
        oidc_providers=tuple(_oidc_providers(config)),
        saml2=_enabled(_section(config, "saml2_config"), True),
        cas=_enabled(_section(config, "cas_config"), True),
        jwt=_enabled(_section(config, "jwt_config"), False),
        password_providers=tuple(_password_providers(config)),
        modules=tuple(_module_names(config, "modules")),
        user_consent=bool(config.get("user_consent")),
        login_via_existing_session=_enabled(_section(config, "login_via_existing_session"), False),
        enable_3pid_changes=None if changes is None else bool(changes),
        lifetimes=tuple(
            key for key in ("refresh_token_lifetime", "nonrefreshable_access_token_lifetime", "session_lifetime")
            if config.get(key)
        ),
        delegated=_delegated(config),
        app_service_config_files=tuple(str(p) for p in config.get("app_service_config_files") or ()),
    )


def _oidc_providers(config: Mapping[str, Any]) -> list[OidcProvider]:
    """Synapse's `_parse_oidc_provider_configs`: each of oidc_providers (enabled unless said
    otherwise), then the old oidc_config if enabled; idp ids prefixed "oidc-" except "oidc"."""
    found = []
    items = config.get("oidc_providers") or []
    if not isinstance(items, list):
        raise SynapseConfigError("oidc_providers: expected a list")
    legacy = _section(config, "oidc_config")
    if legacy and legacy.get("enabled", False):
        items = [*items, legacy]
    for item in items:
        if not isinstance(item, Mapping) or not item.get("enabled", True):
            continue
        idp_id = str(item.get("idp_id", "oidc"))
        found.append(OidcProvider(idp_id if idp_id == "oidc" else f"oidc-{idp_id}", str(item.get("issuer", ""))))
    return found


def _module_names(config: Mapping[str, Any], key: str) -> list[str]:
    items = config.get(key) or []
    if not isinstance(items, list):
        raise SynapseConfigError(f"{key}: expected a list")
    names = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("module"), str):
            raise SynapseConfigError(f"{key}, item {index}: expected a mapping with a module name")
        names.append(item["module"])
    return names


def _password_providers(config: Mapping[str, Any]) -> list[str]:
    """The old `ldap_config` (Synapse's own LDAP key) and `password_providers`."""
    names = ["ldap_auth_provider.LdapAuthProvider"] if _section(config, "ldap_config").get("enabled") else []
    return names + _module_names(config, "password_providers")


def _delegated(config: Mapping[str, Any]) -> bool:
    if _section(config, "matrix_authentication_service").get("enabled"):
        return True
    return bool(_section(_section(config, "experimental_features"), "msc3861").get("enabled"))


def database_settings(config: Mapping[str, Any], base: str) -> DatabaseSettings:
    """The database of Synapse's main data store (synapse/config/database.py's rules)."""
    single, several = config.get("database"), config.get("databases")
    if single and several:
        raise SynapseConfigError("database: Synapse refuses both `database` and `databases`")
    if several:
        if not isinstance(several, Mapping):
            raise SynapseConfigError("databases: expected a mapping")
        for label, entry in several.items():
            if not isinstance(entry, Mapping):
                raise SynapseConfigError(f"databases.{label}: expected a mapping")
            if "main" in (entry.get("data_stores") or ["main", "state"]):
                return _one_database(entry, f"databases.{label}", base)
        raise SynapseConfigError("databases: none holds the main data store (data_stores: [main])")
    if single:
        if not isinstance(single, Mapping):
            raise SynapseConfigError("database: expected a mapping")
        return _one_database(single, "database", base)
    path = config.get("database_path")
    if isinstance(path, str) and path:
        return _sqlite(path, "database_path", base)
    raise SynapseConfigError("database: Synapse's config names no database")


def _one_database(entry: Mapping[str, Any], where: str, base: str) -> DatabaseSettings:
    engine = entry.get("name", "sqlite3")
    args = entry.get("args") or {}
    if not isinstance(args, Mapping):
        raise SynapseConfigError(f"{where}.args: expected a mapping")
    if engine == "sqlite3":
        path = args.get("database")
        if not isinstance(path, str) or not path:
            raise SynapseConfigError(f"{where}.args.database: the SQLite file is not named")
        return _sqlite(path, f"{where}.args.database", base)
    if engine != "psycopg2":
        raise SynapseConfigError(f"{where}.name: unsupported database type {engine!r} (sqlite3 or psycopg2)")
    # psycopg2.connect(**args): `database` is libpq's dbname, None values are dropped, the
    # rest is str()'d into libpq keywords; Synapse drops its cp_* pool options first.
    keywords = {str(k): v for k, v in args.items() if not str(k).startswith("cp_") and v is not None}
    if "database" in keywords:
        if "dbname" in keywords:
            raise SynapseConfigError(f"{where}.args: both database and dbname (psycopg2 refuses that)")
        keywords["dbname"] = keywords.pop("database")
    dsn = keywords.pop("dsn", "")
    return DatabaseSettings("psycopg2", postgres={k: str(v) for k, v in keywords.items()}, dsn=str(dsn))


def _sqlite(path: str, where: str, base: str) -> DatabaseSettings:
    if path == ":memory:" or path.startswith("file:"):
        raise SynapseConfigError(f"{where}: {path!r} is no database file this tool can read")
    return DatabaseSettings("sqlite3", sqlite_path=os.path.normpath(os.path.join(base, path)))
