"""The password login: request checks, then the specification's rules 1-6 in their order."""

from __future__ import annotations

import logging
from backends.base import User
from backends.hashes import stored_password_problem
from homeserver.errors import MatrixError
from homeserver.login_request import LoginRequest, parse_login
from homeserver.names import user_id
from homeserver.passwords import HashDecodeError, Overloaded, PasswordChecker
from homeserver.ratelimit import LoginLimits
from homeserver.sessions import Sessions
from homeserver.tokens import TokenIssuer
from homeserver.users import Users

logger = logging.getLogger(__name__)

__all__ = ["LoginRefused", "LoginRequest", "check_password", "login", "login_outcome", "parse_login"]

UNKNOWN_USER = "Invalid username"
BAD_PASSWORD = "Invalid username or password"


class LoginRefused(MatrixError):
    """Rule 3 or 5's 403, carrying the outcome the metrics count it as."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(403, "M_FORBIDDEN", message)
        self.outcome = outcome


def _make_token(tokens: TokenIssuer, name: str, device_id: str) -> str:
    try:
        return tokens.issue(name, device_id)
    except Exception:
        logger.exception("access token generation failed")
        raise MatrixError(403, "M_UNKNOWN", "Access Token generation failed") from None


def _decoding_failed(users: Users, user: User, why: str) -> MatrixError:
    users.report_unusable_password(user, why)
    return MatrixError(500, "M_UNKNOWN", "Password hash decoding failed")


async def check_password(users: Users, checker: PasswordChecker, user: User, password: str) -> bool:
    """Rules 4-5: the password against the stored hash (or the store's own check, LDAP bind)."""
    verdict = await users.verify_password(user, password)
    if verdict is not None:
        return verdict
    # Rule 4: the stored text is the hex form of the bcrypt hash. One that is not (not
    # hex, or hex of something else) fails here, before it costs a password check.
    stored = user.password
    problem = "no password stored" if stored is None else stored_password_problem(stored)
    if stored is None or problem is not None:
        raise _decoding_failed(users, user, problem or "no password stored")
    hashed = bytes.fromhex(stored)
    # Rule 5: bcrypt, on the password pool, never on the event loop.
    try:
        return await checker.check(password, hashed)
    except HashDecodeError as exc:
        raise _decoding_failed(users, user, str(exc)) from None
    except Overloaded:
        raise MatrixError(
            429,
            "M_LIMIT_EXCEEDED",
            "Too many logins in progress, try again shortly",
            headers={"Retry-After": "1"},
            retry_after_ms=1000,
        ) from None


async def login(
    request: LoginRequest,
    *,
    users: Users,
    tokens: TokenIssuer,
    checker: PasswordChecker,
    server_name: str,
    limits: LoginLimits | None = None,
    sessions: Sessions | None = None,
    client_ip: str = "",
) -> dict[str, str]:
    """Apply rules 1-6; return the login response or raise the rule's MatrixError.

    A login by e-mail address first finds the one user holding it; then rules 1-2 (the
    token, naming that user) and 4-6 apply unchanged.
    """
    limits = limits if limits is not None else LoginLimits()
    if request.email is not None:
        user, token, counted = await _by_email(request, users, tokens, checker, limits)
    else:
        user, token, counted = await _by_name(request, users, tokens, limits)

    if not await check_password(users, checker, user, request.password):  # rules 4-5
        for key in counted:
            await limits.record_failure(key)
        raise LoginRefused(BAD_PASSWORD, "bad_password")

    # Rule 6, once the session of the token is recorded (a 200 is never lost).
    if sessions is not None:
        await sessions.open(token, user.name, request.device_id, request.display_name, client_ip)
    return {
        "user_id": user_id(user.name, server_name),
        "access_token": token,
        "home_server": server_name,
        "device_id": request.device_id,
    }


async def _by_name(
    request: LoginRequest, users: Users, tokens: TokenIssuer, limits: LoginLimits
) -> tuple[User, str, list[str]]:
    """Rules 1-3 for a name: the user, the token, and the limit keys a failure counts on."""
    # Rate limits come before the rules: an account under attack costs no lookup or bcrypt.
    await limits.check_account(request.user)

    # Rules 1-2: the token is built first, from the name as given.
    token = _make_token(tokens, request.user, request.device_id)

    # Rule 3: exact name first, then a case-insensitive match (Complement logs in upper case).
    user = await users.get(request.user, case_insensitive=True)
    if user is None:
        await limits.record_failure(request.user)
        raise LoginRefused(UNKNOWN_USER, "unknown_user")
    if user.name != request.user:
        token = _make_token(tokens, user.name, request.device_id)
    return user, token, [request.user]


async def _by_email(
    request: LoginRequest, users: Users, tokens: TokenIssuer, checker: PasswordChecker, limits: LoginLimits
) -> tuple[User, str, list[str]]:
    """The one user holding the address, then rules 1-2 for that user.

    An address held by nobody, or by several users, is refused as a wrong password is,
    and only after the same bcrypt work, so neither the answer nor its timing tells
    which addresses exist.
    """
    address_key = "email:" + request.email.strip().casefold()
    await limits.check_account(address_key)
    found = await users.by_email(request.email)
    if len(found) != 1:
        if len(found) > 1:
            logger.warning("login by e-mail: an address is held by %d users; refusing it", len(found))
        await checker.waste(request.password)
        await limits.record_failure(address_key)
        raise LoginRefused(BAD_PASSWORD, "unknown_user")
    user = found[0]
    await limits.check_account(user.name)
    return user, _make_token(tokens, user.name, request.device_id), [address_key, user.name]


def login_outcome(error: BaseException | None) -> str:
    """Name a login's outcome for the metrics: success, unknown_user, bad_password, ..."""
    if error is None:
        return "success"
    if isinstance(error, LoginRefused):
        return error.outcome
    if isinstance(error, MatrixError):
        if error.status == 429:
            return "rate_limited"
        if error.status < 500 and error.status != 403:
            return "bad_request"
    return "error"
