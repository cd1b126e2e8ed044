"""The verified-token cache: only valid tokens hit it, and it never outlives a token's exp."""

from __future__ import annotations

import time

import pytest
from jose import jwt

from homeserver.tokens import TokenError, TokenExpired, TokenIssuer
from tests.support.helpers import JWT_SECRET


def tamper(token: str) -> str:
    """Flip one character of the signature."""
    head, _, sig = token.rpartition(".")
    return f"{head}.{sig[:-2]}{'A' if sig[-2] != 'A' else 'B'}{sig[-1]}"


def test_cached_token_still_verifies_and_skips_decoding(monkeypatch):
    tokens = TokenIssuer(JWT_SECRET)
    token = tokens.issue("alice", "DEV")
    first = tokens.verify(token)

    def no_decode(*args, **kwargs):
        raise AssertionError("decoded again although cached")

    monkeypatch.setattr("homeserver.tokens.jwt.decode", no_decode)
    assert tokens.verify(token) == first


def test_tampered_token_rejected_while_the_genuine_one_is_cached():
    tokens = TokenIssuer(JWT_SECRET)
    token = tokens.issue("alice", "DEV")
    tokens.verify(token)
    with pytest.raises(TokenError):
        tokens.verify(tamper(token))
    with pytest.raises(TokenError):
        tokens.verify(tamper(token))  # failures are never cached either


def test_token_of_another_secret_rejected():
    token = TokenIssuer("another-secret-that-is-at-least-32-bytes").issue("alice", "DEV")
    with pytest.raises(TokenError):
        TokenIssuer(JWT_SECRET).verify(token)


def test_cached_token_rejected_once_its_exp_has_passed(monkeypatch):
    tokens = TokenIssuer(JWT_SECRET, lifetime=30)
    token = tokens.issue("alice", "DEV")
    tokens.verify(token)
    now = time.time()
    monkeypatch.setattr("homeserver.tokens.time.time", lambda: now + 31)
    with pytest.raises(TokenExpired):  # soft logout: the client keeps its device
        tokens.verify(token)


def test_expired_token_is_never_cached():
    token = jwt.encode({"sub": "alice", "device_id": "DEV", "exp": int(time.time()) - 10}, JWT_SECRET, "HS256")
    tokens = TokenIssuer(JWT_SECRET)
    for _ in range(2):
        with pytest.raises(TokenExpired):
            tokens.verify(token)


def test_only_a_good_signature_makes_a_token_expired():
    claims = {"sub": "alice", "device_id": "DEV", "exp": int(time.time()) - 10}
    other = "another-secret-that-is-at-least-32-bytes"
    with pytest.raises(TokenError) as caught:
        TokenIssuer(JWT_SECRET).verify(jwt.encode(claims, other, "HS256"))
    assert not isinstance(caught.value, TokenExpired)  # a forged token is never a soft logout
    # Signed with a secret from before a rotation: expired, like any good token.
    with pytest.raises(TokenExpired):
        TokenIssuer(JWT_SECRET, previous=[other]).verify(jwt.encode(claims, other, "HS256"))


def test_entry_is_decoded_again_after_the_ttl(monkeypatch):
    tokens = TokenIssuer(JWT_SECRET, cache_ttl=10)
    token = tokens.issue("alice", "DEV")
    tokens.verify(token)
    calls = []
    real_decode = jwt.decode
    monkeypatch.setattr("homeserver.tokens.jwt.decode", lambda *a, **k: calls.append(1) or real_decode(*a, **k))
    now = time.monotonic()
    monkeypatch.setattr("homeserver.tokens.time.monotonic", lambda: now + 11)
    tokens.verify(token)
    assert calls == [1]


def test_cache_size_is_bounded():
    tokens = TokenIssuer(JWT_SECRET, cache_size=3)
    for i in range(5):
        tokens.verify(tokens.issue(f"user{i}", "DEV"))
    assert len(tokens._cache) == 3
