"""From directory entries to users: the name filter, attribute roles, the stored hash."""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ldap3.utils.conv import escape_filter_chars

from backends.base import StoreDataError, User
from backends.ldap_settings import IDENTITY_ATTRIBUTES, PASSWORD_STAMP_ATTRIBUTES, LdapSettings, ident_text

logger = logging.getLogger(__name__)

# RFC 2307 / OpenLDAP form of a bcrypt hash; the login rules want its hex text.
CRYPT_BCRYPT = re.compile(r"\{crypt\}(\$2[aby]\$.+)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class LdapUser(User):
    """A user found in the directory, remembering its entry's DN for bind mode."""

    dn: str = ""


def password_text(value: str) -> str:
    """Turn a stored `{CRYPT}$2b$...` into the hex text of the hash; anything else as is."""
    match = CRYPT_BCRYPT.fullmatch(value)
    return match.group(1).encode("utf-8").hex() if match else value


def first_text(attrs: dict[str, list[bytes]], names: list[str], dn: str) -> str | None:
    """Return the first non-empty value of the first listed attribute that has one."""
    for name in names:
        for raw in attrs.get(name.lower(), []):
            if name.lower() == "objectguid" and len(raw) == 16:
                # Active Directory's objectGUID is 16 binary bytes in mixed-endian order.
                return str(uuid.UUID(bytes_le=bytes(raw)))
            try:
                text = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                logger.warning("LDAP entry %s: attribute %s holds a value that is not UTF-8 (ignored)", dn, name)
                continue
            if text.strip():
                return text
    return None


# Active Directory's logon names: DOMAIN\user (pre-Windows 2000) and user@domain (the UPN).
AD_ACCOUNT, AD_PRINCIPAL = "sAMAccountName", "userPrincipalName"


def _any_of(attributes: list[str], value: str) -> str:
    escaped = escape_filter_chars(value)
    matches = [f"({attr}={escaped})" for attr in attributes]
    return matches[0] if len(matches) == 1 else f"(|{''.join(matches)})"


def _with_operator_filter(settings: LdapSettings, match: str) -> str:
    return f"(&{settings.filter}{match})" if settings.filter else match


def ad_attribute(settings: LdapSettings, name: str) -> tuple[str, str] | None:
    """For an Active Directory logon name, the attribute it is matched against and the value."""
    if not settings.active_directory:
        return None
    if "\\" in name:
        account = name.split("\\", 1)[1]  # the domain part names the directory we search anyway
        return (AD_ACCOUNT, account) if account else None
    if "@" in name[1:]:
        return AD_PRINCIPAL, name
    return None


def name_filter(settings: LdapSettings, name: str) -> tuple[str, bool]:
    """The search filter for a typed name, every value escaped and ANDed with the operator's
    filter; and whether the name is an Active Directory logon name rather than a user name."""
    ad = ad_attribute(settings, name)
    if ad is not None:
        return _with_operator_filter(settings, _any_of([ad[0]], ad[1])), True
    return _with_operator_filter(settings, _any_of(settings.attributes["name"], name)), False


def listing_filter(settings: LdapSettings) -> str:
    """The search filter of a whole-directory listing: entries with a name, ANDed with the
    operator's filter (so organizational units and service accounts are left out)."""
    present = [f"({attr}=*)" for attr in settings.attributes["name"]]
    return _with_operator_filter(settings, present[0] if len(present) == 1 else f"(|{''.join(present)})")


def email_filter(settings: LdapSettings, address: str) -> str:
    """The search filter for an address: the e-mail attributes (and, on Active Directory, the
    UPN, which Element sends as an address since it has an @)."""
    attributes = list(settings.attributes["email"])
    if settings.active_directory and AD_PRINCIPAL not in attributes:
        attributes.append(AD_PRINCIPAL)
    return _with_operator_filter(settings, _any_of(attributes, address))


def entry_user(
    settings: LdapSettings, entry: dict[str, Any], requested: str | None, case_insensitive: bool
) -> LdapUser | None:
    """Build the User from an entry; None when no name value equals the requested one.

    `requested` None: the entry was found by another attribute (an address, an Active
    Directory logon name); its user name is then its first name attribute's value.
    """
    dn = entry.get("dn", "")
    attrs = {key.lower(): values for key, values in (entry.get("raw_attributes") or {}).items()}
    roles = settings.attributes

    names = []
    for attr in roles["name"]:
        for raw in attrs.get(attr.lower(), []):
            try:
                names.append(bytes(raw).decode("utf-8"))
            except UnicodeDecodeError:
                continue
    # The directory's matching rules also ignore extra spaces and more; keep only
    # an exact match, or a case-insensitive one when the caller asked for it.
    if requested is None:
        name = names[0] if names else None
    else:
        name = next((n for n in names if n == requested), None)
        if name is None and (case_insensitive or settings.lowercase_user_ids):
            name = next((n for n in names if n.casefold() == requested.casefold()), None)
    if name is None:
        return None
    # With several name attributes (log in by uid or mail), the stored name is the
    # first listed one that has a value, so the user ID does not depend on which was typed.
    primary = first_text(attrs, roles["name"][:1], dn)
    if len(roles["name"]) > 1 and primary:
        name = primary

    ident = first_text(attrs, roles["ident"], dn)
    if ident is None:
        raise StoreDataError(f"LDAP entry {dn}: no value for ident ({', '.join(roles['ident'])})")
    ident = ident_text(settings.ident_template, ident)
    avatar = first_text(attrs, roles["avatar_url"], dn)
    if avatar is not None:
        avatar = avatar.strip().split(" ", 1)[0]  # labeledURI is "URI [label]"
    password = None
    if settings.mode == "hash":
        for attr in roles["password"]:
            values = attrs.get(attr.lower(), [])
            if values:
                # Not UTF-8 means not a hash we know; let the login rules report it.
                password = password_text(bytes(values[0]).decode("utf-8", "replace"))
                break
    if settings.lowercase_user_ids:
        name = name.lower()
    # The account state, from the same entry: locked, admin, second factor required, its own
    # identity, its password's stamp.
    locked = settings.locked.matches(attrs) if settings.locked is not None else False
    admin = settings.admin.matches(attrs) if settings.admin is not None else False
    mfa_required = settings.mfa_required.matches(attrs) if settings.mfa_required is not None else False
    uid = first_text(attrs, IDENTITY_ATTRIBUTES, dn) or f"dn:{dn.lower()}"
    stamp = first_text(attrs, PASSWORD_STAMP_ATTRIBUTES, dn) if settings.mode == "bind" else None
    return LdapUser(
        name=name,
        ident=ident,
        password=password,
        display_name=first_text(attrs, roles["display_name"], dn),
        avatar_url=avatar or None,
        email=first_text(attrs, roles["email"], dn),
        locked=locked,
        uid=uid,
        password_stamp=stamp,
        admin=admin,
        mfa_required=mfa_required,
        dn=dn,
    )


def entry_users(settings: LdapSettings, entry: dict[str, Any]) -> list[LdapUser]:
    """Every user an entry is, as lookups find them: one per value of the name attribute (a
    second uid is a second name a person logs in with), or, with several name attributes,
    the one user of the first listed attribute's value. StoreDataError as `entry_user`."""
    roles = settings.attributes["name"]
    if len(roles) > 1:
        user = entry_user(settings, entry, None, False)
        return [user] if user is not None else []
    attrs = {key.lower(): values for key, values in (entry.get("raw_attributes") or {}).items()}
    users: dict[str, LdapUser] = {}
    for raw in attrs.get(roles[0].lower(), []):
        try:
            name = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            continue  # no name anyone can type
        user = entry_user(settings, entry, name, False)
        if user is not None:
            users.setdefault(user.name, user)
    return list(users.values())
