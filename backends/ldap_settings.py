"""The LDAP backend's settings: the validated `[backend.ldap]` section, checked as a whole."""

from __future__ import annotations

import os
import re
import string
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ldap3.core.exceptions import LDAPInvalidFilterError
from ldap3.operation.search import parse_filter

from backends.base import ConfigError, resolve_path
from backends.ldap_locks import LockFilter, default_filter
from backends.secret_file import read_secret_file

ROLES = ("name", "display_name", "ident", "avatar_url", "password", "email")
# The entry's own identity, whichever the directory has (OpenLDAP and 389-DS 2.x entryUUID,
# Active Directory objectGUID, older 389-DS nsUniqueId): a new entry under an old name is
# another account. Without any, the DN stands in.
IDENTITY_ATTRIBUTES = ["entryUUID", "objectGUID", "nsUniqueId"]
# What changes with the password where the directory checks it (bind mode): OpenLDAP
# ppolicy's pwdChangedTime, Active Directory's pwdLastSet.
PASSWORD_STAMP_ATTRIBUTES = ["pwdChangedTime", "pwdLastSet"]
ATTRIBUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*|[0-9]+(\.[0-9]+)+")


@dataclass(frozen=True)
class LdapSettings:
    """The validated `[backend.ldap]` section."""

    uris: list[str]
    bases: list[str]  # searched in order
    filter: str
    bind_dn: str
    bind_password: str
    mode: str
    timeout: float
    start_tls: bool
    ca_file: str
    tls_require_cert: bool
    pool_size: int
    attributes: dict[str, list[str]]
    active_directory: bool = False
    lowercase_user_ids: bool = False
    locked: LockFilter | None = None  # `locked_filter`, or the directory's default
    admin: LockFilter | None = None  # `admin_filter`; None: no entry makes an admin
    mfa_required: LockFilter | None = None  # `mfa_required_filter`; None: no entry must have one
    # The ident as the profile shows it: "{ident}" stands for the ident attribute's value
    # (" ({ident})" with ident = "uid" gives "Alice Liddell (alice)").
    ident_template: str = "{ident}"


def _attribute_list(role: str, value: Any) -> list[str]:
    """Return an attribute mapping as a list of names; ConfigError for a bad name."""
    names = [value] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    for name in names:
        if not isinstance(name, str) or not ATTRIBUTE_NAME.fullmatch(name):
            raise ConfigError(f"backend.ldap.attributes.{role}: {name!r} is not an attribute name")
    return names


def _check_uri(uri: str) -> str:
    """Validate one LDAP URI and return it without the trailing '/' ldap3 rejects."""
    parts = urllib.parse.urlsplit(uri.strip())
    if parts.scheme.lower() not in ("ldap", "ldaps") or not parts.hostname:
        raise ConfigError(f"backend.ldap.uri: {uri!r} must look like ldap://host[:port] or ldaps://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"backend.ldap.uri: {uri!r} must name only a scheme, a host and a port")
    try:
        _ = parts.port  # urllib checks the port only when asked
    except ValueError:
        raise ConfigError(f"backend.ldap.uri: {uri!r} has a bad port") from None
    return f"{parts.scheme.lower()}://{parts.netloc}"


def _check_filter(text: str) -> str:
    """Parenthesise and syntax-check the operator's extra filter."""
    text = text.strip()
    if not text:
        return ""
    if not text.startswith("("):
        text = f"({text})"
    try:
        parse_filter(text, None, auto_escape=False, auto_encode=False, validator=None, check_names=False)
    except LDAPInvalidFilterError as exc:
        raise ConfigError(f"backend.ldap.filter: {text!r} is not a valid LDAP filter ({exc})") from None
    return text


def _check_ident_template(template: str) -> str:
    """`{ident}` exactly once and no other field; `{{` and `}}` stand for literal braces."""
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError:
        fields = []
    if fields != [("ident", "", None)]:
        raise ConfigError(
            f"backend.ldap.ident_template: {template!r} must contain {{ident}} exactly once and no other "
            "{...} (write {{ and }} for literal braces)"
        )
    return template


def ident_text(template: str, ident: str) -> str:
    """Fill the ident template (checked by `_check_ident_template`) with the ident attribute's value."""
    return template.format(ident=ident)


def _optional_filter(options: dict[str, Any], key: str) -> LockFilter | None:
    """An entry filter that is off when empty (`admin_filter`, `mfa_required_filter`)."""
    text = options.get(key) or ""
    return LockFilter(text, f"backend.ldap.{key}") if text.strip() else None


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def parse_settings(options: dict[str, Any], config_dir: str) -> LdapSettings:
    """Check the section's combinations (the schema checked each key alone and gave the defaults)."""
    uris = [_check_uri(u) for u in _as_list(options["uri"]) if u.strip()]
    if not uris:
        raise ConfigError("backend.ldap.uri: must name at least one server")
    bases = [b.strip() for b in _as_list(options["base"]) if b.strip()]
    if not bases:
        raise ConfigError("backend.ldap.base: must name the DN (or DNs) under which users are searched")

    bind_dn = options["bind_dn"]
    password = options["bind_password"]
    password_file = options["bind_password_file"]
    if password and password_file:
        raise ConfigError("backend.ldap: set bind_password or bind_password_file, not both")
    if password_file:
        password_file = resolve_path(password_file, config_dir)
        password = read_secret_file("backend.ldap.bind_password_file", password_file, strip=False)
    # A simple bind with a DN and no password is an "unauthenticated bind": many servers
    # accept it as anonymous, which would hide a configuration mistake.
    if bind_dn and not password:
        raise ConfigError("backend.ldap.bind_dn: needs bind_password or bind_password_file")
    if password and not bind_dn:
        raise ConfigError("backend.ldap.bind_password: set bind_dn too")

    given = options["attributes"]
    attributes = {role: _attribute_list(role, given[role]) for role in ROLES}
    mode = options["mode"]
    for role in ("name", "ident", "password") if mode == "hash" else ("name", "ident"):
        if not attributes[role]:
            raise ConfigError(f"backend.ldap.attributes.{role}: must name at least one attribute")

    ca_file = options["ca_file"]
    if ca_file:
        ca_file = resolve_path(ca_file, config_dir)
        if not os.path.isfile(ca_file):
            raise ConfigError(f"backend.ldap.ca_file: {ca_file} not found")

    return LdapSettings(
        uris=uris,
        bases=bases,
        filter=_check_filter(options["filter"]),
        bind_dn=bind_dn,
        bind_password=password,
        mode=mode,
        timeout=options["timeout"],
        start_tls=options["start_tls"],
        ca_file=ca_file,
        tls_require_cert=options["tls_require_cert"],
        pool_size=options["pool_size"],
        attributes=attributes,
        active_directory=options["active_directory"],
        lowercase_user_ids=options["lowercase_user_ids"],
        locked=LockFilter(
            options.get("locked_filter")
            or default_filter(options["active_directory"], options.get("locked_out_is_locked", False))
        ),
        ident_template=_check_ident_template(options.get("ident_template", "{ident}")),
        admin=_optional_filter(options, "admin_filter"),
        mfa_required=_optional_filter(options, "mfa_required_filter"),
    )
