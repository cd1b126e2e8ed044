"""Turn a request's access token into the authenticated user (as Synapse's `synapse.api.auth`)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import User
from homeserver.errors import unknown_token
from homeserver.names import user_id
from homeserver.tokens import TokenError, TokenIssuer
from homeserver.users import Users


@dataclass(frozen=True, slots=True)
class Requester:
    """The authenticated user of a request, from a verified access token."""

    user: User
    user_id: str
    device_id: str


class Auth:
    """Check a token: signature and expiry, then that its user still exists."""

    def __init__(self, tokens: TokenIssuer, users: Users, server_name: str) -> None:
        self.tokens = tokens
        self.users = users
        self.server_name = server_name

    async def requester(self, token: str) -> Requester:
        """Return the token's requester; 401 M_UNKNOWN_TOKEN for any token that is not good."""
        try:
            claims = self.tokens.verify(token)
        except TokenError:
            raise unknown_token() from None
        user = await self.users.get(claims.name)
        if user is None:
            raise unknown_token()
        return Requester(user=user, user_id=user_id(user.name, self.server_name), device_id=claims.device_id)
