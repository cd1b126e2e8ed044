"""Browser sessions: the account page's own sign-ins, one per browser, kept in the session store.

A browser session is what the page's signed cookie names (homeserver.account_page): it stands
from its sign-in until it ends (the page's sign-out, "sign out everywhere", POST
/logout/all) or its lifetime is over. Kept in the session store so that an end is seen by
every process and server on that store, and so the page can list a user's open ones.
Implemented beside each session store, on its connection (sqlite/browser.py,
redis/browser.py); reached by `SessionStore.browser_sessions()`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

# The user agent is kept for people to tell their browsers apart, no longer than this.
MAX_USER_AGENT = 200


@dataclass(frozen=True, slots=True)
class BrowserSession:
    """One sign-in to the account page."""

    id: str  # the cookie's nonce: random, unique
    user: str
    created: int  # seconds since the epoch
    expires: int  # seconds since the epoch
    ip: str
    user_agent: str
    # The second factor its sign-in passed ("totp", "webauthn", "recovery"); "" for none.
    second_factor: str = ""


class BrowserSessions(abc.ABC):
    """The account page's sign-ins of every user. Every method raises
    `backends.base.StoreUnavailable` when the store cannot answer."""

    @abc.abstractmethod
    async def open(self, session: BrowserSession) -> None:
        """Record a new sign-in; it stands until ended or until `expires`."""

    @abc.abstractmethod
    async def list_open(self, user: str) -> list[BrowserSession]:
        """The user's sign-ins that still stand, oldest first."""

    @abc.abstractmethod
    async def end(self, user: str, session_id: str) -> bool:
        """End one sign-in of the user; True if it stood."""

    @abc.abstractmethod
    async def ended(self, user: str, session_id: str) -> bool:
        """Whether the sign-in no longer stands: ended, past its lifetime, or never recorded
        (a cookie the store does not know is no sign-in). Asked on every page request."""

    @abc.abstractmethod
    async def end_all(self, user: str) -> int:
        """End every sign-in of the user; how many stood."""

