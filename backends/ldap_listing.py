"""The whole directory as users (`LdapBackend.list_users`): a paged search (RFC 2696) of the
listing filter under each base, one page per pool job, on a connection of its own.

A page per job: the loop never waits on the directory, the decoding (ldap3 is pure Python)
runs on the pool's threads, and a login's lookup queued behind the listing waits one page,
not the whole listing (with `pool_size = 1` too); each page has the pool's timeout. A
connection of its own: the cookie that asks for the next page is good only on the
connection that began the search, and pool jobs land on any thread.

The listing is whole or it is `StoreIncomplete`, with the users read so far: the directory
failing or slow part-way, a size limit (OpenLDAP applies its hard size limit to paged
searches too, unless `size.prtotal` lifts it for them), a referral (followed by neither
lookups nor listings), an entry that cannot be a user (no ident). Names several entries
hold are left out, as lookups refuse them.
"""

from __future__ import annotations

import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import ldap3
from ldap3.core.exceptions import LDAPException

from backends.base import StoreDataError, StoreIncomplete, StoreUnavailable, User
from backends.ldap_mapping import LdapUser, entry_users, first_text, listing_filter
from backends.ldap_pool import SIZE_LIMIT_EXCEEDED, SUCCESS, DirectoryFault, LdapPool, describe, why
from backends.ldap_settings import LdapSettings

logger = logging.getLogger(__name__)

# Entries a page asks for: under Active Directory's MaxPageSize (1000), and a page decodes
# in a few tens of milliseconds on a pool thread.
PAGE_SIZE = 500
PAGED_RESULTS = "1.2.840.113556.1.4.319"
REFERRAL = 10
# Active Directory's application partitions: a subtree search from a domain's root returns
# continuation references to them, and they hold no user accounts.
AD_PARTITIONS = ("dc=domaindnszones", "dc=forestdnszones", "cn=configuration")


@dataclass
class Page:
    """What one page of the search brought (built on a pool thread)."""

    users: list[LdapUser] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # names (or DNs) of entries that are no users
    problem: str = ""  # the first unreadable entry's error
    references: list[str] = field(default_factory=list)  # referrals not followed
    limit: str = ""  # why the search ended early (a size limit)
    cookie: bytes = b""  # empty: the last page


def _ad_partition(uri: str) -> bool:
    """Whether a referral points at one of Active Directory's application partitions."""
    dn = urllib.parse.unquote(urllib.parse.urlsplit(uri).path.lstrip("/"))
    first = dn.split(",", 1)[0].replace(" ", "").lower()
    return first in AD_PARTITIONS


class Listing:
    """One listing of the directory; `run` returns its users or raises StoreIncomplete."""

    def __init__(self, settings: LdapSettings, pool: LdapPool, attributes: list[str]) -> None:
        self.settings = settings
        self.pool = pool
        self.attributes = attributes
        self.filter = listing_filter(settings)
        self.users: dict[str, LdapUser] = {}  # the listing's users, by name
        # case-folded name -> (the base that answers for it, the entry's DN or None when two
        # entries hold it, the names listed for it)
        self.owners: dict[str, tuple[int, str | None, list[str]]] = {}
        self.ambiguous: list[str] = []
        self.unreadable: list[str] = []
        self.problem = ""
        self.references: list[str] = []
        self.entries = 0

    async def run(self) -> list[User]:
        try:
            conn = await self.pool.open_connection()
        except StoreUnavailable as exc:
            raise StoreIncomplete(f"the LDAP directory cannot be listed: {exc}") from None
        try:
            for index, base in enumerate(self.settings.bases):
                await self._list_base(conn, index, base)
        finally:
            self.pool.release(conn)
        if self.ambiguous:
            logger.warning(
                "LDAP listing: left out %d name(s) that several entries hold, as logins refuse them: %s",
                len(self.ambiguous), ", ".join(map(repr, self.ambiguous[:5])),
            )
        if self.references:
            raise self._incomplete(
                f"the LDAP directory answered with referrals, which are not followed: {', '.join(self.references[:3])}"
            )
        if self.unreadable:
            raise self._incomplete(f"{len(self.unreadable)} LDAP entries cannot be read as users, e.g. {self.problem}")
        return list(self.users.values())

    def _incomplete(self, reason: str) -> StoreIncomplete:
        return StoreIncomplete(reason, users=list(self.users.values()), unreadable=list(self.unreadable))

    async def _list_base(self, conn: ldap3.Connection, index: int, base: str) -> None:
        cookie = b""
        try:
            while True:
                page = await self.pool.run(self._page, conn, base, cookie)
                for user in page.users:
                    self._take(index, user)
                self.unreadable += page.unreadable
                self.problem = self.problem or page.problem
                self.references += page.references
                if page.limit:
                    raise self._incomplete(page.limit)
                if not page.cookie:
                    return
                cookie = page.cookie
        except StoreUnavailable as exc:
            raise self._incomplete(
                f"the LDAP directory failed after {self.entries} entries of the listing: {exc}"
            ) from None

    def _take(self, index: int, user: LdapUser) -> None:
        """Add one user of base `index`, a page at a time (no pass over every user at the end,
        on the loop): the first base holding a name answers for it, as lookups search the
        bases in order, and a name two entries of that base hold is nobody's."""
        key = user.name.casefold()
        owner = self.owners.get(key)
        if owner is None:
            self.owners[key] = (index, user.dn, [user.name])
            self.users[user.name] = user
        elif owner[0] != index or owner[1] is None:
            return  # an earlier base answered for the name, or it is ambiguous already
        elif owner[1] == user.dn:
            if user.name not in self.users:  # the same entry under another spelling
                owner[2].append(user.name)
                self.users[user.name] = user
        else:
            for name in owner[2]:
                del self.users[name]
            self.owners[key] = (index, None, [])
            self.ambiguous.append(key)

    # -- on a pool thread -------------------------------------------------------------

    def _page(self, deadline: float, conn: ldap3.Connection, base: str, cookie: bytes) -> Page:
        try:
            conn.search(
                base,
                self.filter,
                ldap3.SUBTREE,
                attributes=self.attributes,
                size_limit=0,
                time_limit=self.pool.receive_timeout,
                paged_size=PAGE_SIZE,
                paged_cookie=cookie or None,
            )
        except (LDAPException, OSError) as exc:
            raise DirectoryFault(f"search under {base!r} failed: {why(exc)}") from None
        result: dict[str, Any] = conn.result or {}
        page = Page()
        for item in conn.response or []:
            if item.get("type") == "searchResRef":
                page.references += self._followed_not(item.get("uri") or [])
            elif item.get("type") == "searchResEntry":
                self.entries += 1
                self._read_entry(item, page)
        code = result.get("result")
        if code == SIZE_LIMIT_EXCEEDED:
            page.limit = (
                f"the LDAP directory's size limit ended the listing under {base!r} after {self.entries} entries "
                "(OpenLDAP: lift it for paged searches with size.prtotal in olcLimits or olcSizeLimit)"
            )
        elif code == REFERRAL:
            page.references += self._followed_not(result.get("referrals") or []) or [f"(for {base!r})"]
        elif code != SUCCESS:
            raise DirectoryFault(f"search under {base!r} failed: {describe(conn)}")
        control = (result.get("controls") or {}).get(PAGED_RESULTS) or {}
        page.cookie = bytes((control.get("value") or {}).get("cookie") or b"")
        return page

    def _read_entry(self, item: dict[str, Any], page: Page) -> None:
        try:
            page.users += entry_users(self.settings, item)
        except StoreDataError as exc:
            attrs = {key.lower(): values for key, values in (item.get("raw_attributes") or {}).items()}
            dn = str(item.get("dn", ""))
            page.unreadable.append(first_text(attrs, self.settings.attributes["name"], dn) or dn)
            page.problem = page.problem or str(exc)

    def _followed_not(self, uris: list[str]) -> list[str]:
        """The referrals that make the listing incomplete (not those to AD's partitions)."""
        if self.settings.active_directory:
            return [uri for uri in uris if not _ad_partition(uri)]
        return list(uris)
