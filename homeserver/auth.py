"""Turn a request's access token into the authenticated user (as Synapse's `synapse.api.auth`)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import User
from backends.sessions.base import Session
from homeserver.errors import unknown_token
from homeserver.names import user_id
from homeserver.sessions import Sessions
from homeserver.tokens import TokenError, TokenIssuer
from homeserver.users import Users


@dataclass(frozen=True, slots=True)
class Requester:
    """The authenticated user of a request: the stored user, and the session of the token."""

    user: User
    user_id: str
    device_id: str
    session: Session


class Auth:
    """Check a token: signature and expiry, an open session, and the user still there."""

    def __init__(self, tokens: TokenIssuer, sessions: Sessions, users: Users, server_name: str) -> None:
        self.tokens = tokens
        self.sessions = sessions
        self.users = users
        self.server_name = server_name

    async def requester(self, token: str, client_ip: str | None) -> Requester:
        """Return the token's requester; 401 M_UNKNOWN_TOKEN for any token that is not good.

        `client_ip` None (a token Synapse introspects: the client's address is not known)
        keeps the session's last-seen address.

        A store that cannot answer raises StoreUnavailable (503): never a 401, which would
        make clients throw their token away.
        """
        try:
            claims = self.tokens.verify(token)
        except TokenError:
            raise unknown_token() from None
        # A user gone from the user store is gone for good: soft_logout false.
        user = await self.users.get(claims.name)
        if user is None:
            raise unknown_token()
        # Every request asks the session store: no cache, so a logout is seen by every
        # process and server from the next request on.
        session = await self.sessions.check(token, claims.name, client_ip)
        return Requester(
            user=user, user_id=user_id(user.name, self.server_name), device_id=claims.device_id, session=session
        )
