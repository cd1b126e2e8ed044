"""A person's authenticator app in tests: the secret read from the `otpauth://` link the page
shows (or the service's enrolment), and its codes computed with pyotp, each of a time step
never typed before (the server accepts a step once: a second sign-in within 30 seconds uses the
next step, which the window of ±1 step accepts, and waits only when none is left)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyotp

PERIOD = 30


def secret_of(uri: str) -> str:
    """The secret of an `otpauth://totp/...` link."""
    parts = urlsplit(uri)
    assert parts.scheme == "otpauth" and parts.netloc == "totp", uri
    return parse_qs(parts.query)["secret"][0]


@dataclass
class App:
    """One authenticator app: `code()` gives a code of a step after every one given before."""

    secret: str
    used: int = -1  # the newest step given
    codes: list[str] = field(default_factory=list)

    @classmethod
    def from_uri(cls, uri: str) -> App:
        return cls(secret_of(uri))

    def step_now(self) -> int:
        return int(time.time() // PERIOD)

    def _next_step(self) -> tuple[int, int]:
        """(the step the next code would be of, the current step): the oldest of the window
        (±1 step) not given yet and not about to leave it."""
        now = self.step_now()
        lowest = now - 1 if time.time() - now * PERIOD < PERIOD - 5 else now
        return max(self.used + 1, lowest), now

    def ready(self) -> bool:
        """Whether `code()` would answer without waiting for the next time step."""
        step, now = self._next_step()
        return step <= now + 1

    def code(self) -> str:
        """A code the server takes now, of a step never given before; waits for the next
        step when the window is used up."""
        while True:
            step, now = self._next_step()
            if step <= now + 1:
                break
            time.sleep((now + 1) * PERIOD - time.time() + 0.05)
        self.used = step
        code = pyotp.TOTP(self.secret).at(step * PERIOD)
        self.codes.append(code)
        return code

    def wrong(self) -> str:
        """A code that is none of the window's."""
        window = {pyotp.TOTP(self.secret).at((self.step_now() + i) * PERIOD) for i in (-2, -1, 0, 1, 2)}
        return next(c for c in (f"{n:06d}" for n in range(1_000_000)) if c not in window)


async def add_app(factors: Any, user: str) -> tuple[App, list[str]]:
    """An app added through the service (SecondFactors) as the page adds it: (the app, the
    recovery codes shown)."""
    enrolment = await factors.begin_totp(user)
    app = App.from_uri(enrolment.uri)
    added = await factors.finish_totp(user, enrolment.pending, app.code())
    return app, added.recovery_codes
