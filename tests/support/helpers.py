"""Assertions and small helpers shared by the tests."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import bcrypt

# Tests hash at bcrypt's lowest cost: the cost is read from the hash, so the code path is
# the same as for cost 12, only quicker.
TEST_ROUNDS = 4
JWT_SECRET = "test-secret-that-is-at-least-32-bytes-long!"
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "X-Requested-With, Content-Type, Authorization",
}
_hash_cache: dict[tuple[str, int], str] = {}


def hex_hash(password: str, rounds: int = TEST_ROUNDS, prefix: bytes = b"$2b$") -> str:
    """Hex text of a bcrypt hash of `password` (cached), optionally with another prefix."""
    key = (password, rounds)
    if key not in _hash_cache:
        _hash_cache[key] = bcrypt.hashpw(password.encode("utf-8")[:72], bcrypt.gensalt(rounds)).hex()
    hashed = bytes.fromhex(_hash_cache[key])
    return (prefix + hashed[4:]).hex()


def record(name: str, password: str = "secret", ident: str = "-id", **extra: Any) -> dict[str, Any]:
    """A users-file record with a hashed password."""
    return {"name": name, "password": hex_hash(password), "ident": ident, **extra}


DEFAULT_USERS = [
    record("alice", "wonderland", " [alice]", display_name="Alice", avatar_url="mxc://localhost/alice"),
    record("bob", "builder", "bob-ident"),
]


def ci() -> bool:
    return bool(os.environ.get("CI"))


@dataclass
class Response:
    """What a test fetch returns; printed in full when an assertion fails."""

    status: int
    headers: Any
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<{self.status} {dict(self.headers)!r} {self.body[:500]!r}>"


def assert_json(resp: Response, status: int = 200) -> Any:
    """Check status, exact JSON content type and CORS headers; return the body."""
    assert resp.status == status, resp
    assert resp.headers.get("Content-Type") == "application/json", resp
    for name, value in CORS.items():
        assert resp.headers.get(name) == value, resp
    return resp.json


def assert_error(resp: Response, status: int, errcode: str, message: str | None = None) -> dict[str, Any]:
    """Check a Matrix error: status, errcode, a string error (exactly `message` if given)."""
    body = assert_json(resp, status)
    assert body.get("errcode") == errcode, resp
    assert isinstance(body.get("error"), str) and body["error"], resp
    if message is not None:
        assert body["error"] == message, resp
    return body
