"""The login request: its shape checked, reduced to what the rules need (a name or an address)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homeserver.errors import M_UNKNOWN, MatrixError, invalid_param, missing_param
from homeserver.names import local_name

LOGIN_TYPE = "m.login.password"
TOKEN_LOGIN_TYPE = "m.login.token"
DEFAULT_DEVICE_ID = "DUMMY"
MAX_DEVICE_ID = 512
# A device's display name, as Synapse bounds it.
MAX_DISPLAY_NAME = 100


@dataclass(frozen=True, slots=True)
class LoginRequest:
    user: str  # the name as typed (a full user ID of this server reduced); "" for an address login
    password: str
    device_id: str
    display_name: str | None = None  # initial_device_display_name
    email: str | None = None  # the address of an m.id.thirdparty (medium "email") login
    refresh_token: bool = False  # the client asks for a refresh token (spec v1.3)
    named_device: bool = True  # the client named its device (False: `default_device_id` was given)


@dataclass(frozen=True, slots=True)
class TokenLoginRequest:
    """An `m.login.token` login: the login token a browser sign-in handed back (homeserver.sso)."""

    token: str
    device_id: str
    display_name: str | None = None


def _string(body: dict[str, Any], key: str, where: str | None = None) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid_param(where or key, "a string")
    return value


def _third_party(holder: dict[str, Any], where: str) -> str:
    """The address of a third-party identifier; only e-mail is supported (400 M_UNKNOWN else)."""
    medium = _string(holder, "medium", f"{where}medium")
    address = _string(holder, "address", f"{where}address")
    if medium is None:
        raise missing_param(f"{where}medium")
    if medium != "email":
        raise MatrixError(400, M_UNKNOWN, f"Login with medium {medium!r} is not supported; only email is.")
    if address is None:
        raise missing_param(f"{where}address")
    return address


def _device(body: dict[str, Any], max_device_id: int) -> tuple[str | None, str | None]:
    """The device a login names (None: a new one) and its initial display name, checked."""
    device_id = _string(body, "device_id")
    if device_id is not None and not 0 < len(device_id) <= max_device_id:
        raise invalid_param("device_id", f"a string of 1 to {max_device_id} characters")
    display_name = _string(body, "initial_device_display_name")
    if display_name is not None and len(display_name) > MAX_DISPLAY_NAME:
        raise invalid_param("initial_device_display_name", f"at most {MAX_DISPLAY_NAME} characters")
    return device_id, display_name


def parse_token_login(
    body: dict[str, Any], default_device_id: str = DEFAULT_DEVICE_ID, max_device_id: int = MAX_DEVICE_ID
) -> TokenLoginRequest:
    """Check an `m.login.token` login body's shape (the device as `parse_login` checks it)."""
    token = _string(body, "token")
    if token is None:
        raise missing_param("token")
    device_id, display_name = _device(body, max_device_id)
    return TokenLoginRequest(token=token, device_id=device_id or default_device_id, display_name=display_name)


def parse_login(
    body: dict[str, Any],
    server_name: str,
    default_device_id: str = DEFAULT_DEVICE_ID,
    max_device_id: int = MAX_DEVICE_ID,
) -> LoginRequest:
    """Check the login body's shape; a 400 Matrix error for anything malformed.

    A login naming no device gets `default_device_id` (the specification's DUMMY; with
    delegation a fresh id per login).
    """
    login_type = _string(body, "type")
    if login_type is not None and login_type != LOGIN_TYPE:
        raise MatrixError(400, M_UNKNOWN, "Bad login type.")

    user, email = "", None
    identifier = body.get("identifier")
    if identifier is not None:
        if not isinstance(identifier, dict):
            raise invalid_param("identifier", "an object")
        id_type = _string(identifier, "type", "identifier.type")
        if id_type == "m.id.thirdparty":
            email = _third_party(identifier, "identifier.")
        elif id_type is not None and id_type != "m.id.user":
            raise MatrixError(
                400, M_UNKNOWN, f"Unknown identifier type {id_type!r}; m.id.user and m.id.thirdparty are supported."
            )
        else:
            name = _string(identifier, "user", "identifier.user")
            if name is None:
                raise missing_param("identifier.user")
            user = name
    else:
        # Deprecated top-level forms, still part of v1.12: "user", or "medium" and "address".
        name = _string(body, "user")
        if name is not None:
            user = name
        elif "medium" in body or "address" in body:
            email = _third_party(body, "")
        else:
            raise missing_param("identifier")

    password = _string(body, "password")
    if password is None:
        raise missing_param("password")

    device_id, display_name = _device(body, max_device_id)
    refresh_token = body.get("refresh_token", False)
    if not isinstance(refresh_token, bool):
        raise invalid_param("refresh_token", "true or false")

    # A full user ID of this server is reduced to its name; any other text is a name.
    return LoginRequest(
        user=local_name(user, server_name),
        password=password,
        device_id=device_id or default_device_id,
        display_name=display_name,
        email=email,
        refresh_token=refresh_token,
        named_device=device_id is not None,
    )
