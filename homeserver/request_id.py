"""Request IDs: one per request, on the response (`X-Request-ID`) and on every log line it writes."""

from __future__ import annotations

import logging
import random
import re
from contextvars import ContextVar

HEADER = "X-Request-ID"
# The ID of the request being served in this context ("-" outside any request). Set where
# Tornado makes the handler, so the task that runs the handler (created right after, with
# a copy of this context) and the connection's callbacks both see it; requests on other
# connections run in other tasks, with contexts of their own.
current: ContextVar[str] = ContextVar("request_id", default="-")
# What a proxy may hand us: visible ASCII, no spaces, not too long (it goes into log lines).
_SANE = re.compile(r"[\x21-\x7e]{1,128}")
_bits = random.getrandbits


def new_id() -> str:
    """A fresh ID: 16 hex digits, 64 random bits.

    From `random`, not the system's entropy: an ID only tells requests apart in logs (and
    is shown to the client it answers), so it needs no secrecy, and this saves a getrandom()
    system call per request. `random` seeds itself from the system at start-up and again in
    every forked worker, so workers never share a sequence.
    """
    return f"{_bits(64):016x}"


def choose(header: str | None, from_trusted_proxy: bool) -> str:
    """Keep a trusted proxy's well-formed ID, so one request can be followed through both
    logs; make a fresh one for anyone else (a client could send anything)."""
    if from_trusted_proxy and header and _SANE.fullmatch(header):
        return header
    return new_id()


def begin(request_id: str) -> None:
    """Make `request_id` the current request's, for every log line from here on."""
    current.set(request_id)


class RequestIdFilter(logging.Filter):
    """Put the current request's ID on each record (`%(request_id)s`, the JSON `request_id`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current.get()
        return True
