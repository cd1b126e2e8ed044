"""Login tokens: what a legacy client's browser sign-in (MSC3824, `/login/sso/redirect`) hands
back to the client, for `POST /login {"type": "m.login.token"}`. Kept in the session store so
that any process or server on it can take one; each is taken once and lives at most a couple
of minutes (homeserver.sso says how long). Kept as SHA-256 digests only, never as the token.

Implemented beside each session store, on its connection (sqlite/login_tokens.py,
redis/login_tokens.py); reached by `SessionStore.login_tokens()`.
"""

from __future__ import annotations

import abc
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class LoginTokenRecord:
    """What a login token stands for: the browser sign-in that made it (its user, the
    credential fingerprints and nonce its cookie carries) and its life."""

    user: str
    identity_fp: str
    password_fp: str
    browser_session: str  # the nonce of the browser session (its cookie) that made the token
    created: int  # seconds since the epoch
    expires: int  # seconds since the epoch: not taken after it
    # What the browser session says of its second step (issue 38's mark, copied when the
    # token is made; "" for none): the session the token opens records it.
    second_factor: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> LoginTokenRecord:
        return cls(**json.loads(text))


class LoginTokenStore(abc.ABC):
    """The login tokens of every user. Every method raises `backends.base.StoreUnavailable`
    when the store cannot answer."""

    @abc.abstractmethod
    async def add(self, token_hash: str, record: LoginTokenRecord) -> None:
        """Keep a token's record until `record.expires` (a token already kept is not replaced)."""

    @abc.abstractmethod
    async def take(self, token_hash: str) -> LoginTokenRecord | None:
        """The token's record, gone from the store as it is read (atomic: of two takes at once,
        one gets it); None when unknown, taken already or expired."""
