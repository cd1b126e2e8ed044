"""The password login: request checks, then the specification's rules 1-6 in their order; and
the token login (`m.login.token`, MSC3824), whose login token a browser sign-in made
(homeserver.sso), opening its session on the same path."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from backends.base import User
from backends.sessions.login_tokens import LoginTokenRecord
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.devices import MAX_SYNAPSE_DEVICE_ID, new_device_id
from homeserver.errors import (
    M_FORBIDDEN,
    M_UNKNOWN,
    M_USER_DEACTIVATED,
    M_USER_LOCKED,
    MatrixError,
    user_deactivated,
    user_locked,
)
from homeserver.jsonio import decode_json_object
from homeserver.login_request import (
    DEFAULT_DEVICE_ID,
    MAX_DEVICE_ID,
    TOKEN_LOGIN_TYPE,
    LoginRequest,
    parse_login,
    parse_token_login,
)
from homeserver.names import local_name, possible_name, user_id
from homeserver.passwords import PasswordChecker, check_password, waste_password_check
from homeserver.ratelimit import LoginLimits
from homeserver.sessions import REPLACED, Sessions
from homeserver.tokens import TokenIssuer
from homeserver.users import Users

if TYPE_CHECKING:
    from homeserver.metrics import Metrics
    from homeserver.refresh import LegacyRefresh

logger = logging.getLogger(__name__)

UNKNOWN_USER = "Invalid username"
BAD_PASSWORD = "Invalid username or password"
# The audit trail's reason for a token login.
TOKEN_VIA = "login token (browser sign-in)"
# `m.login.password` for a person who has or must have a second factor, after the password passed.
SECOND_FACTOR_REQUIRED = "This account signs in with a second factor: sign in through the browser (single sign-on)."


class LoginRefused(MatrixError):
    """Rule 3 or 5's 403, carrying the outcome the metrics count it as."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(403, M_FORBIDDEN, message)
        self.outcome = outcome


class SynapseLogins(Protocol):
    """What a login needs of the delegation (homeserver.delegation.Delegation): Synapse told
    of the user and the device around the session's opening."""

    def login(self, user: User, device_id: str, display_name: str | None) -> AbstractAsyncContextManager[None]: ...


class TokenLogins(Protocol):
    """What a token login needs of the login tokens (homeserver.sso.LoginTokens)."""

    async def take(self, token: str) -> tuple[User, LoginTokenRecord]: ...

    async def give_back(self, token: str, record: LoginTokenRecord) -> None: ...


# A session opener: (user, request, token, client address, whether the client named the
# device, fingerprints) -> the session recorded.
Opener = Callable[[User, LoginRequest, str, str, bool, dict[str, str | None]], Awaitable[None]]


def login_outcome(error: BaseException | None) -> str:
    """Name a login's outcome for the metrics: success, unknown_user, bad_password, ..."""
    if error is None:
        return "success"
    if isinstance(error, LoginRefused):
        return error.outcome
    if isinstance(error, MatrixError):
        if error.errcode == M_USER_LOCKED:
            return "locked"
        if error.errcode == M_USER_DEACTIVATED:
            return "deactivated"
        if error.status == 429:
            return "rate_limited"
        if error.status < 500 and error.status != 403:
            return "bad_request"
    return "error"


def _typed(request: LoginRequest) -> str:
    """The name typed, for the audit line until the stored user is found. An address stays
    out of it, and so does a name no account can have (over 255 bytes, control characters)."""
    return request.user if request.email is None and possible_name(request.user) else ""


def form_request(name: str, password: str, server_name: str) -> LoginRequest:
    """A sign-in form's name and password as a login request (no device: it opens no session).

    As Element does: text with an @ after its first character is an e-mail address; a full
    user ID of this server is reduced to its name."""
    if "@" in name[1:] and not name.startswith("@"):
        return LoginRequest(user="", password=password, device_id="", email=name)
    return LoginRequest(user=local_name(name, server_name), password=password, device_id="")


class LoginService:
    """Password logins: the limits, rules 1-6, the session of the token, the metrics."""

    def __init__(
        self,
        *,
        users: Users,
        tokens: TokenIssuer,
        checker: PasswordChecker,
        sessions: Sessions,
        server_name: str,
        limits: LoginLimits | None = None,
        metrics: Metrics | None = None,
        credentials: Credentials | None = None,
        delegation: SynapseLogins | None = None,
        login_tokens: TokenLogins | None = None,
        deactivated: Callable[[str], Awaitable[bool]] | None = None,
        refresh: LegacyRefresh | None = None,
        second_factor: Callable[[User], Awaitable[bool]] | None = None,
    ) -> None:
        self.users = users
        self.tokens = tokens
        self.checker = checker
        self.sessions = sessions
        self.server_name = server_name
        self.limits = limits if limits is not None else LoginLimits()
        self.metrics = metrics
        self.credentials = credentials
        self.delegation = delegation
        # `m.login.token` (with `[mfa]` or `[oauth]`, MSC3824); None: only passwords.
        self.login_tokens = login_tokens
        # Whether Synapse had deactivated a user when it moved here (the session store's
        # ImportedState.is_deactivated): refused for good, whatever the user store says.
        self.deactivated = deactivated
        # The refresh tokens of logins that ask `refresh_token: true` (homeserver.refresh).
        self.refresh = refresh
        self.second_factor = second_factor  # must they pass a second step (mfa.policy); None: [mfa] off
        # The device id of a login that names none, the longest one a client may name, and
        # where the session opens: chosen once, by whether Synapse is behind this server.
        self._new_device_id: Callable[[], str]
        self._open: Opener
        if delegation is None:
            self._new_device_id, self._max_device_id = (lambda: DEFAULT_DEVICE_ID), MAX_DEVICE_ID
            self._open = self._open_here
        else:
            # One device per login (Synapse keeps keys and to-device messages per device),
            # and a device id Synapse takes.
            self._new_device_id, self._max_device_id = new_device_id, MAX_SYNAPSE_DEVICE_ID
            self._open = self._open_at_synapse

    async def login(self, body: bytes, client_ip: str) -> dict[str, Any]:
        """Check the request body (JSON), apply rules 1-6; return the login response or raise the rule's MatrixError."""
        attempt: dict[str, str] = {}
        try:
            response = await self._login(body, client_ip, attempt)
        except Exception as exc:
            self._observe(exc)
            self._audit(attempt, client_ip, exc)
            raise
        self._observe(None)
        self._audit(attempt, client_ip, None)
        return response

    async def authenticate(
        self, name: str, password: str, client_ip: str, *, reason: str, typed: bool = True
    ) -> User:
        """The user a form's name (a name, a full user ID of this server, or an e-mail
        address) and password prove, as a login finds them, with the same limits and answers
        (a locked account's M_USER_LOCKED included); no token and no session (the account
        page). Audited as a login is, with `reason` saying whose form it was. `typed` False:
        `name` is a signed-in user's stored name (the password asked again), taken as it is,
        never read as an address."""
        if typed:
            request = form_request(name, password, self.server_name)
        else:
            request = LoginRequest(user=name, password=password, device_id="")
        attempt = {"typed": _typed(request), "via": reason}
        try:
            await self.limits.check_address(client_ip)
            user, _ = await self._verify(request, attempt, issue=False)
        except Exception as exc:
            self._audit(attempt, client_ip, exc)
            raise
        self._audit(attempt, client_ip, None)
        return user

    def _observe(self, error: BaseException | None) -> None:
        if self.metrics is not None:
            self.metrics.observe_login(login_outcome(error))

    @staticmethod
    def _audit(attempt: dict[str, str], client_ip: str, error: BaseException | None) -> None:
        """The login's audit line: who (as stored, else as typed), which device, the outcome."""
        audit.audit(
            audit.LOGIN,
            user=attempt.get("user") or attempt.get("typed"),
            device=attempt.get("device"),
            client=client_ip,
            outcome=login_outcome(error),
            reason=attempt.get("via"),
        )

    async def _login(self, body: bytes, client_ip: str, attempt: dict[str, str]) -> dict[str, Any]:
        await self.limits.check_address(client_ip)
        fresh = self._new_device_id()
        fields = decode_json_object(body)
        if self.login_tokens is not None and fields.get("type") == TOKEN_LOGIN_TYPE:
            return await self._token_login(fields, fresh, client_ip, attempt)
        request = parse_login(fields, self.server_name, fresh, max_device_id=self._max_device_id)
        attempt.update(typed=_typed(request), device=request.device_id)
        attempt["via"] = "password, by e-mail address" if request.email is not None else "password"
        user, token = await self._verify(request, attempt, issue=True)
        if self.second_factor is not None and await self.second_factor(user):
            raise LoginRefused(SECOND_FACTOR_REQUIRED, "second_factor_required")
        if request.refresh_token and self.refresh is not None:
            return await self._with_refresh(user, request, client_ip, attempt)
        await self._open(user, request, token, client_ip, request.device_id != fresh, self._fingerprints(user))
        return self._response(user, token, request.device_id)

    def _fingerprints(self, user: User) -> dict[str, str | None]:
        """The fingerprints of the credential a new session of the user is opened with."""
        fingerprint = self.credentials.of(user) if self.credentials is not None else None
        return {
            "identity_fp": fingerprint.identity if fingerprint else None,
            "password_fp": fingerprint.password if fingerprint else None,
        }

    def _response(self, user: User, token: str, device_id: str) -> dict[str, str]:
        return {
            "user_id": user_id(user.name, self.server_name),
            "access_token": token,
            "home_server": self.server_name,
            "device_id": device_id,
        }

    async def _token_login(
        self, fields: dict[str, object], fresh: str, client_ip: str, attempt: dict[str, str]
    ) -> dict[str, str]:
        """`m.login.token`: the login token taken (once; 403 M_FORBIDDEN when unknown, used or
        expired), then the session opened as a password login's (the device, Synapse told
        first under delegation, the audit line). A login that cannot finish for the server's
        sake (the store or Synapse away) gives the token back for the client's retry."""
        assert self.login_tokens is not None
        request = parse_token_login(dict(fields), fresh, max_device_id=self._max_device_id)
        attempt.update(device=request.device_id, via=TOKEN_VIA)
        user, record = await self.login_tokens.take(request.token)
        attempt["user"] = user.name
        token = self._make_token(user.name, request.device_id)
        opening = LoginRequest(user=user.name, password="", device_id=request.device_id,
                               display_name=request.display_name)
        # The session records the second factor the browser sign-in passed (record.second_factor,
        # copied from the browser session when the token was made), beside the fingerprints.
        fingerprints = {**self._fingerprints(user), "second_factor": record.second_factor}
        try:
            await self._open(user, opening, token, client_ip, request.device_id != fresh, fingerprints)
        except Exception as exc:
            if not (isinstance(exc, MatrixError) and exc.status < 500):
                await self._give_back(request.token, record)
            raise
        return self._response(user, token, request.device_id)

    async def _give_back(self, token: str, record: LoginTokenRecord) -> None:
        assert self.login_tokens is not None
        try:
            await self.login_tokens.give_back(token, record)
        except Exception as exc:  # the store still away: the person signs in again
            logger.warning("a login token of %r could not be kept for a retry: %r", record.user, exc)

    async def _with_refresh(
        self, user: User, request: LoginRequest, client_ip: str, attempt: dict[str, str]
    ) -> dict[str, Any]:
        """A login that asked for a refresh token (spec v1.3): a grant of its device, whose access
        token expires (homeserver.refresh). A refresh token is one device's, so a login that
        names no device gets one of its own, never the DUMMY every other such login shares."""
        assert self.refresh is not None
        device_id = request.device_id if request.named_device or self.delegation is not None else new_device_id()
        attempt["device"] = device_id
        issued = await self.refresh.open(user, device_id, request.display_name, client_ip)
        return {
            "user_id": user_id(user.name, self.server_name),
            "access_token": issued.access_token,
            "home_server": self.server_name,
            "device_id": device_id,
            "refresh_token": issued.refresh_token,
            "expires_in_ms": self.refresh.expires_in_ms,
        }

    async def _open_here(
        self,
        user: User,
        request: LoginRequest,
        token: str,
        client_ip: str,
        named: bool,
        fingerprints: dict[str, str | None],
    ) -> None:
        """Rule 6, once the session of the token is recorded (a 200 is never lost)."""
        await self.sessions.open(token, user.name, request.device_id, request.display_name, client_ip, **fingerprints)

    async def _open_at_synapse(
        self,
        user: User,
        request: LoginRequest,
        token: str,
        client_ip: str,
        named: bool,
        fingerprints: dict[str, str | None],
    ) -> None:
        """With delegation: Synapse has the user and the device first (503 and nothing done
        here when it cannot be told); then the device's earlier sessions end (MAS's rule: one
        device, one session; the device and its keys stay at Synapse) and this one opens."""
        assert self.delegation is not None
        async with self.delegation.login(user, request.device_id, request.display_name):
            if named:
                await self.sessions.end_devices(user.name, [request.device_id], REPLACED)
            await self.sessions.open(
                token, user.name, request.device_id, request.display_name, client_ip, **fingerprints
            )

    async def _verify(self, request: LoginRequest, attempt: dict[str, str], *, issue: bool) -> tuple[User, str]:
        """Rules 1-5 and the lock: the user and (with `issue`) the token naming them.

        A login by e-mail address first finds the one user holding it; then rules 1-2 (the
        token, naming that user) and 4-5 apply unchanged. The lock is checked last, as
        Synapse's `_complete_login` does: an unknown name and a wrong password answer as
        for anyone; a locked account gets no session, and with delegation Synapse is not asked.
        A user Synapse had deactivated when it moved here is refused after the password too,
        as Synapse refuses one (403 M_USER_DEACTIVATED).
        """
        if request.email is not None:
            user, token, counted = await self._by_email(request, issue)
        else:
            user, token, counted = await self._by_name(request, issue)
        if not await check_password(self.users, self.checker, user, request.password):  # rules 4-5
            for key in counted:
                await self.limits.record_failure(key)
            raise LoginRefused(BAD_PASSWORD, "bad_password")
        attempt["user"] = user.name
        if self.deactivated is not None and await self.deactivated(user.name):
            raise user_deactivated()
        if user.locked:
            raise user_locked()
        return user, token

    def _make_token(self, name: str, device_id: str) -> str:
        try:
            return self.tokens.issue(name, device_id)
        except Exception:
            logger.exception("access token generation failed")
            raise MatrixError(403, M_UNKNOWN, "Access Token generation failed") from None

    async def _by_name(self, request: LoginRequest, issue: bool) -> tuple[User, str, list[str]]:
        """Rules 1-3 for a name: the user, the token, and the limit keys a failure counts on."""
        # Rate limits come before the rules: an account under attack costs no lookup or bcrypt.
        await self.limits.check_account(request.user)

        # Rules 1-2: the token is built first, from the name as given.
        token = self._make_token(request.user, request.device_id) if issue else ""

        # Rule 3: exact name first, then a case-insensitive match (Complement logs in upper case).
        user = await self.users.get(request.user, case_insensitive=True)
        if user is None:
            # The same work as a wrong password (bcrypt: ~0.2 s at cost 12 against ~2 ms).
            await waste_password_check(self.users, self.checker, request.password)
            await self.limits.record_failure(request.user)
            raise LoginRefused(UNKNOWN_USER, "unknown_user")
        if issue and user.name != request.user:
            token = self._make_token(user.name, request.device_id)
        return user, token, [request.user]

    async def _by_email(self, request: LoginRequest, issue: bool) -> tuple[User, str, list[str]]:
        """The one user holding the address, then rules 1-2 for that user.

        An address held by nobody, or by several users, is refused as a wrong password is,
        and only after the same bcrypt work, so neither the answer nor its timing tells
        which addresses exist.
        """
        assert request.email is not None
        address_key = "email:" + request.email.strip().casefold()
        await self.limits.check_account(address_key)
        found = await self.users.by_email(request.email)
        if len(found) != 1:
            if len(found) > 1:
                logger.warning("login by e-mail: an address is held by %d users; refusing it", len(found))
            await waste_password_check(self.users, self.checker, request.password)
            await self.limits.record_failure(address_key)
            raise LoginRefused(BAD_PASSWORD, "unknown_user")
        user = found[0]
        await self.limits.check_account(user.name)
        token = self._make_token(user.name, request.device_id) if issue else ""
        return user, token, [address_key, user.name]
