"""The password login: request checks, then the specification's rules 1-6 in their order."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from backends.base import User
from backends.hashes import stored_password_problem
from homeserver.errors import MatrixError, invalid_param, missing_param
from homeserver.names import local_name, user_id
from homeserver.passwords import HashDecodeError, Overloaded, PasswordChecker
from homeserver.ratelimit import LoginLimits
from homeserver.sessions import MAX_DISPLAY_NAME, Sessions
from homeserver.tokens import TokenIssuer
from homeserver.users import Users

logger = logging.getLogger(__name__)

LOGIN_TYPE = "m.login.password"
DEFAULT_DEVICE_ID = "DUMMY"
MAX_DEVICE_ID = 512
UNKNOWN_USER = "Invalid username"
BAD_PASSWORD = "Invalid username or password"


class LoginRefused(MatrixError):
    """Rule 3 or 5's 403, carrying the outcome the metrics count it as."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(403, "M_FORBIDDEN", message)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class LoginRequest:
    user: str
    password: str
    device_id: str
    display_name: str | None = None  # initial_device_display_name


def _string(body: dict[str, Any], key: str, where: str | None = None) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid_param(where or key, "a string")
    return value


def parse_login(body: dict[str, Any], server_name: str) -> LoginRequest:
    """Check the login body's shape; a 400 Matrix error for anything malformed."""
    login_type = _string(body, "type")
    if login_type is not None and login_type != LOGIN_TYPE:
        raise MatrixError(400, "M_UNKNOWN", "Bad login type.")

    identifier = body.get("identifier")
    if identifier is not None:
        if not isinstance(identifier, dict):
            raise invalid_param("identifier", "an object")
        id_type = _string(identifier, "type", "identifier.type")
        if id_type is not None and id_type != "m.id.user":
            raise MatrixError(400, "M_UNKNOWN", f"Unknown identifier type {id_type!r}; only m.id.user is supported.")
        user = _string(identifier, "user", "identifier.user")
        if user is None:
            raise missing_param("identifier.user")
    else:
        # Deprecated top-level form, still part of v1.12.
        user = _string(body, "user")
        if user is None:
            if "medium" in body or "address" in body:
                raise MatrixError(400, "M_UNKNOWN", "Login with third-party identifiers is not supported.")
            raise missing_param("identifier")

    password = _string(body, "password")
    if password is None:
        raise missing_param("password")

    device_id = _string(body, "device_id")
    if device_id is not None and not 0 < len(device_id) <= MAX_DEVICE_ID:
        raise invalid_param("device_id", f"a string of 1 to {MAX_DEVICE_ID} characters")
    display_name = _string(body, "initial_device_display_name")
    if display_name is not None and len(display_name) > MAX_DISPLAY_NAME:
        raise invalid_param("initial_device_display_name", f"at most {MAX_DISPLAY_NAME} characters")

    # A full user ID of this server is reduced to its name; any other text is a name.
    return LoginRequest(
        user=local_name(user, server_name),
        password=password,
        device_id=device_id or DEFAULT_DEVICE_ID,
        display_name=display_name,
    )


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
    """Apply rules 1-6; return the login response or raise the rule's MatrixError."""
    # Rate limits come before the rules: an account under attack costs no lookup or bcrypt.
    if limits is not None:
        await limits.check_account(request.user)

    # Rules 1-2: the token is built first, from the name as given.
    token = _make_token(tokens, request.user, request.device_id)

    # Rule 3: exact name first, then a case-insensitive match (Complement logs in upper case).
    user = await users.get(request.user, case_insensitive=True)
    if user is None:
        if limits is not None:
            await limits.record_failure(request.user)
        raise LoginRefused(UNKNOWN_USER, "unknown_user")
    if user.name != request.user:
        token = _make_token(tokens, user.name, request.device_id)

    if not await check_password(users, checker, user, request.password):  # rules 4-5
        if limits is not None:
            await limits.record_failure(request.user)
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
