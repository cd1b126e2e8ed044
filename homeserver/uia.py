"""User-Interactive Authentication with the `m.login.password` stage (device deletion)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from backends.base import User
from homeserver import base64url
from homeserver.errors import M_FORBIDDEN, M_UNKNOWN, M_UNRECOGNIZED, MatrixError, invalid_param, missing_param
from homeserver.names import local_name
from homeserver.passwords import PasswordChecker, check_password
from homeserver.ratelimit import LoginLimits
from homeserver.requester import Requester
from homeserver.users import Users

PASSWORD_STAGE = "m.login.password"
FLOWS = [{"stages": [PASSWORD_STAGE]}]
# How long a UIA session may take to complete (Element keeps the dialog open a while).
SESSION_TTL = 15 * 60


class AuthRequired(MatrixError):
    """The first 401 of UIA: flows, params and session, and no errcode.

    As the specification and Synapse have it: js-sdk reads an errcode in this answer as a
    failed attempt. The one exception to "every error carries errcode".
    """

    def __init__(self, session: str) -> None:
        super().__init__(401, "", "User-interactive authentication required")
        self.session = session

    def body(self) -> dict[str, Any]:
        return {"flows": FLOWS, "params": {}, "session": self.session}


class UserInteractiveAuth:
    """Stateless UIA sessions: each is signed, names its user and its operation, and expires.

    Stateless so any worker or server can continue a session another one started; the
    signing key is derived from the token secret, so it needs no configuration.
    """

    def __init__(
        self,
        secret: str,
        users: Users,
        checker: PasswordChecker,
        limits: LoginLimits,
        server_name: str,
        *,
        second_factor: Callable[[User], Awaitable[bool]] | None = None,
        account_url: str = "",
    ) -> None:
        self.key = hmac.new(secret.encode("utf-8"), b"homeserver user-interactive auth", hashlib.sha256).digest()
        self.users = users
        self.checker = checker
        self.limits = limits
        self.server_name = server_name
        # Whether a person signs in with a second factor (homeserver.mfa.policy; None when
        # `[mfa]` is off): a password alone does not stand for them (docs/mfa.md, "Device
        # deletion"), so they end sessions on the account page (`account_url`).
        self.second_factor = second_factor
        self.account_url = account_url

    def new_session(self, user: str, operation: str, now: float | None = None) -> str:
        payload = json.dumps({"u": user, "o": operation, "e": int((now or time.time()) + SESSION_TTL)}).encode()
        mac = hmac.new(self.key, payload, hashlib.sha256).digest()[:16]
        return base64url.encode(payload) + "." + base64url.encode(mac)

    def _session_ok(self, session: str, user: str, operation: str) -> bool:
        try:
            payload_text, _, mac_text = session.partition(".")
            payload = base64url.decode(payload_text)
            mac = base64url.decode(mac_text)
        except (ValueError, UnicodeError):
            return False
        # The signature first: only a session this server made is ever parsed.
        if not hmac.compare_digest(mac, hmac.new(self.key, payload, hashlib.sha256).digest()[:16]):
            return False
        try:
            fields = json.loads(payload)
        except ValueError:
            return False
        return (
            isinstance(fields, dict)
            and fields.get("u") == user
            and fields.get("o") == operation
            and isinstance(fields.get("e"), int)
            and fields["e"] >= time.time()
        )

    async def check(self, requester: Requester, body: dict[str, Any], operation: str) -> None:
        """Return when `body["auth"]` proves the requester's password; raise the UIA answer otherwise.

        `operation` names what is being authorised (method, path, devices): a session
        started for one operation cannot complete another.
        """
        user = requester.user.name
        if self.second_factor is not None and await self.second_factor(requester.user):
            message = "This account signs in with a second factor: sign out sessions on your account page"
            raise MatrixError(403, M_FORBIDDEN, f"{message}, {self.account_url}")
        auth = body.get("auth")
        if auth is None:
            raise AuthRequired(self.new_session(user, operation))
        if not isinstance(auth, dict):
            raise invalid_param("auth", "an object")
        session = auth.get("session")
        if session is None:
            # Clients may authenticate in one go, as Synapse allows.
            session = self.new_session(user, operation)
        elif not isinstance(session, str):
            raise invalid_param("auth.session", "a string")
        elif not self._session_ok(session, user, operation):
            raise MatrixError(400, M_UNKNOWN, "Unknown or expired session ID, or the operation changed")
        if auth.get("type") != PASSWORD_STAGE:
            raise self._failed(session, M_UNRECOGNIZED, f"Only {PASSWORD_STAGE} is supported")
        named = self._named_user(auth)
        if named is not None and named != user and named.casefold() != user.casefold():
            raise MatrixError(403, M_FORBIDDEN, "Invalid auth: not the user of this access token")
        password = auth.get("password")
        if password is None:
            raise missing_param("auth.password")
        if not isinstance(password, str):
            raise invalid_param("auth.password", "a string")
        # A wrong password here is a failed login: it counts, and the limit applies.
        await self.limits.check_failures(user)
        if not await check_password(self.users, self.checker, requester.user, password):
            await self.limits.record_failure(user)
            raise self._failed(session, M_FORBIDDEN, "Invalid password")

    def _named_user(self, auth: dict[str, Any]) -> str | None:
        identifier = auth.get("identifier")
        if isinstance(identifier, dict) and isinstance(identifier.get("user"), str):
            return local_name(identifier["user"], self.server_name)
        legacy = auth.get("user")  # deprecated form
        return local_name(legacy, self.server_name) if isinstance(legacy, str) else None

    @staticmethod
    def _failed(session: str, errcode: str, message: str) -> MatrixError:
        return MatrixError(401, errcode, message, flows=FLOWS, params={}, completed=[], session=session)
