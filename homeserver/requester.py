"""The authenticated user of a request (as Synapse's `Requester`): what the auth step hands on."""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import User
from backends.sessions.base import Session


@dataclass(frozen=True, slots=True)
class Requester:
    """The authenticated user of a request: the stored user, and the session of the token."""

    user: User
    user_id: str
    device_id: str
    session: Session
