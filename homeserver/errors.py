"""The errors an answer is made of: raised anywhere, written by the handlers' one error path.

`HTTPProblem` is every such error: a status, a message and the headers the answer carries
(`Retry-After`, `WWW-Authenticate`). Its kinds differ only in the body: `MatrixError` (the
API's JSON `errcode`/`error`), `homeserver.oauth.errors.OAuthError` (OAuth's `error` /
`error_description`) and `PageError` (a sentence on an HTML page). The handlers apply the
status and headers in one place (`handlers.base.ServerHandler.answer_problem`) and render
only the body, each side its own (starlette's `HTTPException`, jupyter_server's
`APIHandler.write_error`).

The Matrix error codes, and the errors more than one place raises, are named here once.
"""

from __future__ import annotations

import math
from typing import Any

# The store layer's exceptions; the service maps them to Matrix errors (store_unavailable).
from backends.base import ConfigError, StoreDataError, StoreUnavailable

__all__ = [
    "M_BAD_JSON",
    "M_FORBIDDEN",
    "M_INVALID_PARAM",
    "M_INVALID_USERNAME",
    "M_LIMIT_EXCEEDED",
    "M_MISSING_PARAM",
    "M_MISSING_TOKEN",
    "M_NOT_FOUND",
    "M_NOT_JSON",
    "M_TOO_LARGE",
    "M_UNKNOWN",
    "M_UNKNOWN_TOKEN",
    "M_UNRECOGNIZED",
    "M_USER_DEACTIVATED",
    "M_USER_LOCKED",
    "ConfigError",
    "HTTPProblem",
    "MatrixError",
    "PageError",
    "StoreDataError",
    "StoreUnavailable",
    "invalid_param",
    "limit_exceeded",
    "missing_param",
    "shutting_down",
    "store_unavailable",
    "too_large",
    "unknown_token",
    "unrecognized",
    "user_deactivated",
    "user_locked",
]

M_BAD_JSON = "M_BAD_JSON"
M_FORBIDDEN = "M_FORBIDDEN"
M_INVALID_PARAM = "M_INVALID_PARAM"
M_INVALID_USERNAME = "M_INVALID_USERNAME"  # Synapse refuses a name it cannot register
M_LIMIT_EXCEEDED = "M_LIMIT_EXCEEDED"
M_MISSING_PARAM = "M_MISSING_PARAM"
M_MISSING_TOKEN = "M_MISSING_TOKEN"
M_NOT_FOUND = "M_NOT_FOUND"
M_NOT_JSON = "M_NOT_JSON"
M_TOO_LARGE = "M_TOO_LARGE"
M_UNKNOWN = "M_UNKNOWN"
M_UNKNOWN_TOKEN = "M_UNKNOWN_TOKEN"
M_UNRECOGNIZED = "M_UNRECOGNIZED"
M_USER_LOCKED = "M_USER_LOCKED"
M_USER_DEACTIVATED = "M_USER_DEACTIVATED"


class HTTPProblem(Exception):
    """An answer that is no success: its HTTP status, a message, and the headers it carries."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the error (each kind has its own keys)."""
        return {"error": self.message}


class PageError(HTTPProblem):
    """What a page tells the person (a wrong password, a limit, a code that expired, a store
    down): a sentence for people, shown on the page with the status and headers."""


class MatrixError(HTTPProblem):
    """An error of the Matrix API: an HTTP status, a Matrix errcode and a human-readable message."""

    def __init__(
        self,
        status: int,
        errcode: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(status, message, headers)
        self.args = (f"{status} {errcode}: {message}",)
        self.errcode = errcode
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """Return the Matrix error body: errcode and error always, then any extra keys."""
        return {"errcode": self.errcode, "error": self.message, **self.extra}


def missing_param(name: str) -> MatrixError:
    return MatrixError(400, M_MISSING_PARAM, f"Missing parameter: {name}")


def invalid_param(name: str, expected: str) -> MatrixError:
    return MatrixError(400, M_INVALID_PARAM, f"Parameter {name} must be {expected}")


def unrecognized(status: int = 404) -> MatrixError:
    """An unknown path (404) or a method the path does not take (405)."""
    return MatrixError(status, M_UNRECOGNIZED, "Unrecognized request")


def too_large(limit: int) -> MatrixError:
    return MatrixError(413, M_TOO_LARGE, f"Request body is larger than {limit} bytes")


def limit_exceeded(seconds: float) -> MatrixError:
    """The 429 answer, with the wait both in the body and as a Retry-After header."""
    return MatrixError(
        429,
        M_LIMIT_EXCEEDED,
        "Too many requests",
        headers={"Retry-After": str(max(1, math.ceil(seconds)))},
        retry_after_ms=max(1, math.ceil(seconds * 1000)),
    )


def unknown_token(message: str = "Unrecognised access token.", *, soft_logout: bool = False) -> MatrixError:
    return MatrixError(401, M_UNKNOWN_TOKEN, message, soft_logout=soft_logout)


def user_locked() -> MatrixError:
    """A locked account (v1.12 "Account locking"): the client keeps its session and device."""
    return MatrixError(401, M_USER_LOCKED, "User account has been locked", soft_logout=True)


def user_deactivated() -> MatrixError:
    """A user Synapse had deactivated when it moved here (as Synapse answers a password login)."""
    return MatrixError(403, M_USER_DEACTIVATED, "This account has been deactivated")


def store_unavailable(exc: StoreUnavailable) -> MatrixError:
    return MatrixError(
        503,
        M_UNKNOWN,
        f"The {exc.store} is temporarily unavailable, try again later",
        headers={"Retry-After": str(exc.retry_after)},
    )


def shutting_down(retry_after: int = 1) -> MatrixError:
    """503 while the server drains: readiness and requests cut off by the drain timeout."""
    return MatrixError(503, M_UNKNOWN, "The server is shutting down", headers={"Retry-After": str(retry_after)})
