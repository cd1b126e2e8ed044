"""LDAP user backend: users found by an escaped filter under a base DN, checked by hash or bind.

The work is split by job: `ldap_settings` (the section, checked), `ldap_pool` (threads and
connections), `ldap_mapping` (filters and entries to users); this module ties them to the
UserBackend interface.
"""

from __future__ import annotations

import logging
import secrets
from functools import partial
from typing import Any

import ldap3

from backends.base import StoreUnavailable, User, UserBackend
from backends.ldap_listing import Listing
from backends.ldap_mapping import LdapUser, email_filter, entry_user, name_filter
from backends.ldap_pool import (
    INVALID_CREDENTIALS,
    SIZE_LIMIT_EXCEEDED,
    SUCCESS,
    TRANSIENT_RESULTS,
    DirectoryFault,
    LdapPool,
    describe,
)
from backends.ldap_settings import IDENTITY_ATTRIBUTES, PASSWORD_STAMP_ATTRIBUTES, LdapSettings, parse_settings

logger = logging.getLogger(__name__)

__all__ = ["LdapBackend", "LdapUser"]


class LdapBackend(UserBackend):
    """Users from an LDAP directory; passwords from its bcrypt hash or by binding as the user."""

    name = "ldap"

    def __init__(self, settings: LdapSettings) -> None:
        self.settings = settings
        self.pool = LdapPool(settings)
        attrs = settings.attributes
        wanted = attrs["name"] + attrs["display_name"] + attrs["ident"] + attrs["avatar_url"] + attrs["email"]
        if settings.mode == "hash":
            wanted += attrs["password"]
        else:
            wanted += PASSWORD_STAMP_ATTRIBUTES
        # The account state comes with the same search: the entry's identity and what the
        # lock, admin and second-factor filters read (operational attributes such as
        # memberOf are only sent when asked for by name).
        wanted += IDENTITY_ATTRIBUTES
        for entry_filter in (settings.locked, settings.admin, settings.mfa_required):
            if entry_filter is not None:
                wanted += entry_filter.attributes
        self._wanted = list(dict.fromkeys(wanted))

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> LdapBackend:
        return cls(parse_settings(options, config_dir))

    # -- the UserBackend interface -----------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        logger.info(
            "LDAP backend: %s, base %s, mode %s%s%s, locked: %s%s%s", ", ".join(s.uris),
            " then ".join(map(repr, s.bases)), s.mode, ", StartTLS" if s.start_tls else "",
            ", Active Directory names" if s.active_directory else "", s.locked.text if s.locked is not None else "-",
            f", admins: {s.admin.text}" if s.admin is not None else "",
            f", second factor required: {s.mfa_required.text}" if s.mfa_required is not None else "",
        )
        try:
            await self.check_health()
        except StoreUnavailable as exc:
            # Serve anyway: every lookup retries, so the service heals when the directory does.
            logger.warning("LDAP directory not usable at start-up (%s); retrying on each request", exc)

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        # The service never passes a name no account can have (homeserver.names).
        return await self.pool.run(self._find_user, name, case_insensitive)

    async def get_users_by_email(self, address: str) -> list[User]:
        return await self.pool.run(self._find_by_email, address)

    async def list_users(self) -> list[User]:
        """Every entry matching `filter` under the bases, by paged searches (backends.ldap_listing)."""
        return await Listing(self.settings, self.pool, self._wanted).run()

    async def verify_password(self, user: User, password: str) -> bool | None:
        if self.settings.mode != "bind":
            return None
        # An empty password would make an "unauthenticated bind", which succeeds.
        if not password:
            return False
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            return False  # lone surrogates: no directory password can match
        dn = user.dn if isinstance(user, LdapUser) else ""
        if not dn:
            found = await self.get_user(user.name)
            if not isinstance(found, LdapUser):
                return False
            dn = found.dn
        return await self.pool.run(self._bind_as, dn, password)

    async def waste_password_check(self, password: str) -> bool:
        if self.settings.mode != "bind":
            return False
        if not password:
            return True  # refused before any bind, as verify_password does
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            return True
        # A bind as an entry nobody has: the directory answers "invalid credentials", as it
        # does for a wrong password, after the same round trip.
        dn = f"cn={secrets.token_hex(8)},{self.settings.bases[0]}"
        await self.pool.run(self._bind_as, dn, password)
        return True

    async def check_health(self) -> None:
        await self.pool.run(self._probe)

    async def close(self) -> None:
        self.pool.close()

    # -- work done on the pool's threads -----------------------------------------------

    def _search(self, deadline: float, flt: str) -> list[dict[str, Any]]:
        """The entries matching `flt` in the first base (in order) that has any; at most two."""

        def search(conn: ldap3.Connection, base: str) -> list[dict[str, Any]]:
            conn.search(
                base,
                flt,
                ldap3.SUBTREE,
                attributes=self._wanted,
                size_limit=2,  # two are enough to see the name is ambiguous
                time_limit=self.pool.receive_timeout,
            )
            code = (conn.result or {}).get("result")
            if code not in (SUCCESS, SIZE_LIMIT_EXCEEDED):
                raise DirectoryFault(f"search under {base!r} failed: {describe(conn)}")
            return [r for r in conn.response or [] if r.get("type") == "searchResEntry"]

        for base in self.settings.bases:
            entries = self.pool.with_connection("service", deadline, partial(search, base=base))
            if entries:
                return entries
        return []

    def _find_user(self, deadline: float, name: str, case_insensitive: bool) -> LdapUser | None:
        flt, logon_name = name_filter(self.settings, name)
        entries = self._search(deadline, flt)
        if len(entries) != 1:
            if len(entries) > 1:
                logger.warning("LDAP: name %r matches several entries; refusing it", name)
            return None
        return entry_user(self.settings, entries[0], None if logon_name else name, case_insensitive)

    def _find_by_email(self, deadline: float, address: str) -> list[User]:
        entries = self._search(deadline, email_filter(self.settings, address))
        users = [entry_user(self.settings, entry, None, True) for entry in entries]
        return [user for user in users if user is not None]

    def _bind_as(self, deadline: float, dn: str, password: str) -> bool:
        """Bind as the user on this thread's bind connection: True, False, or a fault."""

        def bind(conn: ldap3.Connection) -> bool:
            if self.pool.simple_bind(conn, dn, password):
                return True
            code = (conn.result or {}).get("result")
            if code in TRANSIENT_RESULTS or code is None:
                raise DirectoryFault(f"bind as {dn!r} failed: {describe(conn)}")
            if code != INVALID_CREDENTIALS:
                # Locked or expired accounts and the like: refused, but tell the operator why.
                logger.info("LDAP bind as %r refused: %s", dn, describe(conn))
            return False

        return self.pool.with_connection("binder", deadline, bind)

    def _probe(self, deadline: float) -> None:
        """Read the base entry: proves the connection, the service bind and the base DN."""

        def probe(conn: ldap3.Connection) -> None:
            for base in self.settings.bases:
                conn.search(base, "(objectClass=*)", ldap3.BASE, attributes=["1.1"], size_limit=1)
                if (conn.result or {}).get("result") != SUCCESS:
                    raise DirectoryFault(f"base {base!r} cannot be read: {describe(conn)}")

        self.pool.with_connection("service", deadline, probe)
