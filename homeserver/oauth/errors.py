"""The OAuth 2.0 errors (RFC 6749 section 5.2, RFC 7591 section 3.2.2, RFC 7009): `error` and
`error_description`, as the token, registration and revocation endpoints answer them and the
authorization endpoint puts them on the redirect."""

from __future__ import annotations

import math
from typing import Any

from homeserver.errors import HTTPProblem

INVALID_REQUEST = "invalid_request"
INVALID_CLIENT = "invalid_client"
INVALID_GRANT = "invalid_grant"
INVALID_SCOPE = "invalid_scope"
UNAUTHORIZED_CLIENT = "unauthorized_client"
UNSUPPORTED_GRANT_TYPE = "unsupported_grant_type"
UNSUPPORTED_RESPONSE_TYPE = "unsupported_response_type"
UNSUPPORTED_TOKEN_TYPE = "unsupported_token_type"
ACCESS_DENIED = "access_denied"
LOGIN_REQUIRED = "login_required"  # OpenID Connect: prompt=none, and a person must act
SERVER_ERROR = "server_error"
TEMPORARILY_UNAVAILABLE = "temporarily_unavailable"
INVALID_REDIRECT_URI = "invalid_redirect_uri"
INVALID_CLIENT_METADATA = "invalid_client_metadata"


class OAuthError(HTTPProblem):
    """An OAuth error: the `error` code, a description for developers (the message), the HTTP
    status and headers (homeserver.errors.HTTPProblem)."""

    def __init__(self, error: str, description: str, status: int = 400, headers: dict[str, str] | None = None) -> None:
        if error == INVALID_CLIENT:  # RFC 6749 5.2: a 401 names the scheme the client should use
            headers = {"WWW-Authenticate": "Basic", **(headers or {})}
        super().__init__(status, description, headers)
        self.args = (f"{error}: {description}",)
        self.error = error

    @property
    def description(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "error_description": self.description}


def invalid_grant(description: str) -> OAuthError:
    return OAuthError(INVALID_GRANT, description)


def invalid_request(description: str) -> OAuthError:
    return OAuthError(INVALID_REQUEST, description)


def retry_after(wait: float) -> dict[str, str]:
    """The Retry-After header of a wait in seconds (at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(wait)))}


def too_many(description: str, wait: float) -> OAuthError:
    """429 for a rate limit of the OAuth endpoints (RFC 6749 has no code for it)."""
    return OAuthError(TEMPORARILY_UNAVAILABLE, description, 429, retry_after(wait))
