"""The audit trail: one structured line on the `homeserver.audit` logger per security event.

Logins (success and failure), logouts, revocations, locks and unlocks seen, sessions
ended because the account's credential changed or the account was removed, and, with
delegation, users deactivated at Synapse after they left the user store and reactivated
when they came back. Each line
names the event, the user, the device, the client address, the request ID (from the
logging filter) and the reason; never a password, a token or a hash. The text format
writes `audit <event> key="value" ...`; the JSON format writes the same keys as fields
of the line's object (homeserver.logs.JsonFormatter).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar

logger = logging.getLogger("homeserver.audit")

# The client address of the request being served ("" outside requests), set by the base
# handler once it knows it, so services deep below HTTP can name it without passing it on.
client_address: ContextVar[str] = ContextVar("audit_client_address", default="")

# Events.
LOGIN = "login"
LOGOUT = "logout"
REVOKE = "revoke"
LOCK = "lock"
UNLOCK = "unlock"
SESSIONS_ENDED = "sessions_ended"
DEACTIVATE = "deactivate"
REACTIVATE = "reactivate"

# The attribute of the log record that carries the fields (the JSON formatter reads it).
FIELDS_ATTRIBUTE = "audit"


def _text(value: object) -> str:
    # JSON string quoting: a device ID or a typed name from a client cannot forge a line.
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def audit(
    event: str,
    *,
    user: str | None,
    device: str | None = None,
    client: str | None = None,
    reason: str | None = None,
    outcome: str | None = None,
    count: int | None = None,
    level: int = logging.INFO,
) -> None:
    """Write one audit line. `client` defaults to the current request's address."""
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, object] = {"event": event, "user": user}
    if outcome is not None:
        fields["outcome"] = outcome
    fields["device"] = device
    fields["client"] = client if client is not None else (client_address.get() or None)
    if reason is not None:
        fields["reason"] = reason
    if count is not None:
        fields["count"] = count
    message = "audit " + event + "".join(
        f" {key}={_text(value)}" for key, value in fields.items() if key != "event" and value is not None
    )
    logger.log(level, "%s", message, extra={FIELDS_ATTRIBUTE: fields})
