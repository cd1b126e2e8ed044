"""Authenticator apps (TOTP, RFC 6238): new secrets, the otpauth:// link, and code checks that
say which time step matched, so a code already accepted is refused (a replay in its window)."""

from __future__ import annotations

import hmac
import time

import pyotp

# What every authenticator app assumes when the link says nothing else: 6 digits, a new
# code every 30 seconds, HMAC-SHA1 (RFC 6238's default; apps ignore `algorithm=` often).
DIGITS = 6
PERIOD = 30
# Codes of one step before and after the current one pass too (RFC 6238 section 5.2: a
# phone's clock a little off, a code typed as it changes): three codes a check.
WINDOW = 1
# 32 base32 characters, 160 bits: RFC 4226's recommended length for the shared secret.
SECRET_LENGTH = 32
_MAX_CODE_LENGTH = 64  # past this a text is no code (it is not even looked at)


def new_secret() -> str:
    """A fresh random secret, base32 as authenticator apps take it (160 bits)."""
    return pyotp.random_base32(SECRET_LENGTH)


def _label_part(text: str) -> str:
    # The link's label is `issuer:account`, and neither part may hold a colon of its own (the
    # Key Uri Format; apps split on it): a server name's port loses its colon.
    return text.replace(":", " ").strip() or "Matrix"


def provisioning_uri(secret: str, account: str, issuer: str) -> str:
    """The `otpauth://totp/ISSUER:ACCOUNT?secret=…&issuer=ISSUER` link apps read from a QR code.

    `account` names the person (their user name), `issuer` the server; both are
    percent-encoded. The link holds the secret: it goes into the page, never into a log or
    a URL the server answers with.
    """
    return pyotp.TOTP(secret, digits=DIGITS, interval=PERIOD).provisioning_uri(
        name=_label_part(account), issuer_name=_label_part(issuer)
    )


def normalize_code(text: str) -> str | None:
    """The digits of a typed code (spaces and a middle dash or dot dropped: "123 456"), or None
    when it cannot be a code."""
    if len(text) > _MAX_CODE_LENGTH:
        return None
    digits = "".join(text.split()).replace("-", "").replace(".", "")
    if len(digits) != DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    return digits


def current_step(now: float | None = None) -> int:
    """The RFC 6238 time step of `now` (seconds since the epoch; the clock when None)."""
    return int((time.time() if now is None else now) // PERIOD)


def matching_step(secret: str, code: str, now: float | None = None, window: int = WINDOW) -> int | None:
    """The time step within ±`window` of `now` whose code is `code`, or None.

    The caller accepts it only if the step is newer than the last step accepted for this
    factor (and records it, atomically): a code is then good once. Every code of the window
    is computed and compared in constant time (hmac.compare_digest), whatever matches, so
    the time taken says nothing about the code. When two steps of the window share the
    code (one in a million), the newest counts.
    """
    digits = normalize_code(code)
    if digits is None:
        return None
    otp = pyotp.TOTP(secret, digits=DIGITS, interval=PERIOD)
    step = current_step(now)
    typed = digits.encode("ascii")
    found: int | None = None
    for candidate in range(step - window, step + window + 1):
        if candidate >= 0 and hmac.compare_digest(typed, otp.generate_otp(candidate).encode("ascii")):
            found = candidate
    return found


def code_at(secret: str, step: int) -> str:
    """The code of time step `step` (for tests and the bench: what the app shows then)."""
    return pyotp.TOTP(secret, digits=DIGITS, interval=PERIOD).generate_otp(step)
