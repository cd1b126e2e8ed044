"""Matrix errors raised anywhere and turned into JSON bodies by the base handler."""

from __future__ import annotations

from typing import Any

# The store layer's exceptions; the service maps them to Matrix errors (store_unavailable).
from backends.base import ConfigError, StoreDataError, StoreUnavailable

__all__ = [
    "ConfigError",
    "MatrixError",
    "StoreDataError",
    "StoreUnavailable",
    "invalid_param",
    "missing_param",
    "store_unavailable",
    "unknown_token",
]


class MatrixError(Exception):
    """An error with an HTTP status, a Matrix errcode and a human-readable message."""

    def __init__(
        self,
        status: int,
        errcode: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(f"{status} {errcode}: {message}")
        self.status = status
        self.errcode = errcode
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """Return the Matrix error body: errcode and error always, then any extra keys."""
        return {"errcode": self.errcode, "error": self.message, **self.extra}


def missing_param(name: str) -> MatrixError:
    return MatrixError(400, "M_MISSING_PARAM", f"Missing parameter: {name}")


def invalid_param(name: str, expected: str) -> MatrixError:
    return MatrixError(400, "M_INVALID_PARAM", f"Parameter {name} must be {expected}")


def unknown_token(message: str = "Unrecognised access token.", *, soft_logout: bool = False) -> MatrixError:
    return MatrixError(401, "M_UNKNOWN_TOKEN", message, soft_logout=soft_logout)


def store_unavailable(exc: StoreUnavailable) -> MatrixError:
    return MatrixError(
        503,
        "M_UNKNOWN",
        f"The {exc.store} is temporarily unavailable, try again later",
        headers={"Retry-After": str(exc.retry_after)},
    )
