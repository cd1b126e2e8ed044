"""Turn a request's access token into the authenticated user (as Synapse's `synapse.api.auth`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from backends.base import User
from backends.sessions.base import Session
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.errors import unknown_token, user_locked
from homeserver.names import user_id
from homeserver.requester import Requester
from homeserver.sessions import Sessions, token_digest
from homeserver.synapse_tokens import ACCESS_PREFIX, maybe_legacy, synapse_token_user
from homeserver.tokens import TokenError, TokenExpired, TokenIssuer
from homeserver.users import Users

# The user of a token a Synapse moved here carried that does not name its user (a macaroon),
# by its digest (backends.sessions.imported.ImportedState.token_user).
TokenUser = Callable[[str], Awaitable[str | None]]

# Users seen locked by this process, remembered so a lock and an unlock are audited once
# each; past this many the memory starts afresh (at worst a lock is audited again).
MAX_LOCKED_SEEN = 10_000


class Auth:
    """Check a token: signature and expiry, an open session, the user still there, still the
    account and the credential the session was opened with, and not locked."""

    def __init__(
        self,
        tokens: TokenIssuer,
        sessions: Sessions,
        users: Users,
        server_name: str,
        credentials: Credentials | None = None,
        end_stale: Callable[[User, str], Awaitable[object]] | None = None,
        imported_token_user: TokenUser | None = None,
    ) -> None:
        self.tokens = tokens
        self.sessions = sessions
        self.users = users
        self.server_name = server_name
        self.credentials = credentials
        # Ends the sessions of a user opened with another credential (`Devices.end_stale`,
        # through which every end of a session goes), given the reason.
        self.end_stale = end_stale
        self.imported_token_user = imported_token_user
        self._locked_seen: set[str] = set()

    async def requester(self, token: str, client_ip: str | None, *, allow_locked: bool = False) -> Requester:
        """Return the token's requester; 401 M_UNKNOWN_TOKEN for any token that is not good,
        401 M_USER_LOCKED for a locked account's (unless `allow_locked`: logout).

        `client_ip` None (a token Synapse introspects: the client's address is not known)
        keeps the session's last-seen address.

        A store that cannot answer raises StoreUnavailable (503): never a 401, which would
        make clients throw their token away.
        """
        name, device_id = await self._named(token)
        # A user gone from the user store is gone for good: soft_logout false. The lookup
        # brings the lock and what the credential fingerprints are made of: no other trip.
        user = await self.users.get(name)
        if user is None:
            raise unknown_token()
        # Every request asks the session store, which answers from what it read before
        # only while no process has written since: a logout is seen by every process and
        # server from the next request on.
        session = await self.sessions.check(token, name, client_ip)
        if self.credentials is not None:
            why = self.credentials.stale(session, user)
            if why is not None:
                # Another account under the name, or a new password: the session is over,
                # in the store too, so it stays over whatever the user store does next.
                if self.end_stale is not None:
                    await self.end_stale(user, why)
                raise unknown_token()
        if user.locked:
            self._saw_lock(user.name, session)
            if not allow_locked:
                raise user_locked()
        elif self._locked_seen and user.name in self._locked_seen:
            self._locked_seen.discard(user.name)
            audit.audit(audit.UNLOCK, user=user.name, device=session.device_id, reason="seen by the auth step")
        return Requester(
            user=user, user_id=user_id(user.name, self.server_name), device_id=device_id or session.device_id,
            session=session,
        )

    async def _named(self, token: str) -> tuple[str, str | None]:
        """The user a token names and, for ours, its device (a token carried from Synapse has
        its device in its session alone); 401 M_UNKNOWN_TOKEN for a token of neither kind."""
        if token.startswith(ACCESS_PREFIX):
            # Synapse's own, carried by a move (homeserver.synapse_tokens): its CRC, then its session.
            name = synapse_token_user(token)
            return (name, None) if name is not None else (await self._carried(token), None)
        try:
            claims = self.tokens.verify(token)
        except TokenExpired:
            # As Synapse: the client logs in again on the same device and keeps its keys.
            raise unknown_token(soft_logout=True) from None
        except TokenError:
            if not maybe_legacy(token):
                raise unknown_token() from None
            return await self._carried(token), None
        return claims.name, claims.device_id

    async def _carried(self, token: str) -> str:
        """The user of a token carried from Synapse that does not name it (an older Synapse's
        macaroon), from the move's bookkeeping; 401 M_UNKNOWN_TOKEN for any other text."""
        found = await self.imported_token_user(token_digest(token)) if self.imported_token_user else None
        if found is None:
            raise unknown_token()
        return found

    def _saw_lock(self, name: str, session: Session) -> None:
        """Audit a lock the first time this process sees it (per process, not per request)."""
        if name in self._locked_seen:
            return
        if len(self._locked_seen) >= MAX_LOCKED_SEEN:
            self._locked_seen.clear()
        self._locked_seen.add(name)
        audit.audit(audit.LOCK, user=name, device=session.device_id, reason="seen by the auth step")
