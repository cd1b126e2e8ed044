"""Tokens: HS256 with a pinned algorithm list, and the generated-once secret."""

import base64
import json
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homeserver.config import build_config
from homeserver.errors import ConfigError
from homeserver.tokens import ALGORITHMS, MAX_TOKEN_LENGTH, TokenError, TokenIssuer, check_shape, load_secret

SECRET = "k" * 32


def test_round_trip_and_claims():
    issuer = TokenIssuer(SECRET)
    claims = issuer.verify(issuer.issue("alice", "DEV"))
    assert (claims.name, claims.device_id) == ("alice", "DEV")
    assert ALGORITHMS == ["HS256"]


def test_tokens_are_what_python_jose_signs(monkeypatch):
    # Issued without python-jose's key construction: the same bytes as its jwt.encode, and
    # it reads them back (a secret with non-ASCII text too).
    import secrets
    import time

    from jose import jwt

    issuer = TokenIssuer("a-sécret-of-the-server-0123456789", lifetime=300)
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: "fixed-nonce-1234")
    token = issuer.issue("@élan:example.org", "DEVICE1")
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    assert abs(exp - (time.time() + 300)) < 5
    claims = {"sub": "@élan:example.org", "device_id": "DEVICE1", "exp": exp}
    assert token == jwt.encode(claims, issuer.secret, algorithm="HS256", headers={"nonce": "fixed-nonce-1234"})
    decoded = jwt.decode(token, issuer.secret, algorithms=ALGORITHMS)
    assert (decoded["sub"], decoded["device_id"]) == ("@élan:example.org", "DEVICE1")
    assert TokenIssuer(issuer.secret).verify(token).name == "@élan:example.org"


def test_expired_token_is_refused():
    issuer = TokenIssuer(SECRET, lifetime=-10)
    with pytest.raises(TokenError):
        issuer.verify(issuer.issue("alice", "DEV"))


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "...", "e30.e30.", "\x00", "\ud800", "ä.ä.ä"])
def test_garbage_is_a_token_error(token):
    with pytest.raises(TokenError):
        TokenIssuer(SECRET).verify(token)


def config_in(tmp_path, **auth):
    return build_config({"auth": auth}, path=str(tmp_path / "hs.toml"), environ={})


def test_configured_secret_wins(tmp_path):
    assert load_secret(config_in(tmp_path, jwt_secret=SECRET)) == SECRET
    assert not (tmp_path / "jwt.secret").exists()


def test_secret_is_generated_once_kept_private_and_reused(tmp_path):
    first = load_secret(config_in(tmp_path))
    path = tmp_path / "jwt.secret"
    assert len(first) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_secret(config_in(tmp_path)) == first
    # Tokens issued before a restart verify after it.
    token = TokenIssuer(first).issue("alice", "D")
    assert TokenIssuer(load_secret(config_in(tmp_path))).verify(token).name == "alice"


def test_a_short_kept_secret_is_an_error(tmp_path):
    (tmp_path / "jwt.secret").write_text("short\n")
    with pytest.raises(ConfigError, match=r"^auth\.secret_file"):
        load_secret(config_in(tmp_path))


def test_secret_file_in_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^auth\.secret_file: cannot create"):
        load_secret(config_in(tmp_path, secret_file="no/such/dir/secret"))


OLD, NEW = "o" * 32, "n" * 32


def test_rotation_accepts_the_previous_secret_and_signs_with_the_new():
    old_token = TokenIssuer(OLD).issue("alice", "D")
    rotated = TokenIssuer(NEW, previous=[OLD])
    assert rotated.verify(old_token).name == "alice"
    new_token = rotated.issue("bob", "D")
    # Signed with the new secret only: a server still on the old one alone refuses it.
    with pytest.raises(TokenError):
        TokenIssuer(OLD).verify(new_token)
    assert TokenIssuer(NEW).verify(new_token).name == "bob"
    # Dropping the old secret (a restart with the new config) ends its tokens.
    with pytest.raises(TokenError):
        TokenIssuer(NEW).verify(old_token)
    # An expired token stays expired whatever secret signed it.
    expired = TokenIssuer(OLD, lifetime=-10).issue("alice", "D")
    with pytest.raises(TokenError, match="expired"):
        TokenIssuer(NEW, previous=[OLD]).verify(expired)


def test_previous_secrets_are_checked_at_start_up(tmp_path):
    config = build_config({"auth": {"jwt_secret": NEW, "previous_jwt_secrets": [OLD]}}, environ={})
    assert config.get("auth", "previous_jwt_secrets") == [OLD]
    with pytest.raises(ConfigError, match=r"^auth\.previous_jwt_secrets"):
        build_config({"auth": {"previous_jwt_secrets": ["short"]}}, environ={})
    from_env = build_config({}, environ={"HOMESERVER_AUTH__PREVIOUS_JWT_SECRETS": f'["{OLD}"]'})
    assert from_env.get("auth", "previous_jwt_secrets") == [OLD]


# -- hostile shapes: refused as TokenError (a 401), never another error ---------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jws(header: bytes, payload: bytes = b"{}") -> str:
    return ".".join([b64(header), b64(payload), b64(b"sig")])


def nested_header_token(depth: int = 100_000) -> str:
    """What made python-jose raise RecursionError: a header of deeply nested JSON."""
    return jws(b"[" * depth + b"]" * depth)


UNTERMINATED = b'{"alg":"HS256","a":"' + b'\\"' * 2000


@pytest.mark.parametrize(
    "token",
    [
        nested_header_token(),
        nested_header_token(900),
        jws(b"{" + b'"a":{' * 5000 + b"}" * 5001),
        jws(b'{"alg":"HS256"}', b"[" * 5000),
        jws(b'"HS256"'),  # a JSON string, not an object
        jws(b"[]"),
        jws(UNTERMINATED),
        "e30.e30.c2ln=",  # padding is not in the alphabet
        "e30.e30.c2l+",
        "e30.e30.e30.c2ln",
        "e30." + "A" * 9000 + ".c2ln",
    ],
)
def test_hostile_shapes_are_token_errors(token):
    with pytest.raises(TokenError):
        TokenIssuer(SECRET).verify(token)


def test_a_shape_our_tokens_never_have_costs_no_quadratic_time():
    """Escaped quotes that never close: the string scan is linear (a regex search retried at
    each quote took ~50 ms for an 8 KB token)."""
    import time

    token = jws(b'{"a":"' + b'\\"' * 2900)
    assert len(token) <= 8192
    start = time.perf_counter()
    for _ in range(10):
        with pytest.raises(TokenError):
            check_shape(token)
    assert time.perf_counter() - start < 0.25  # quadratic: ~0.5 s; linear: ~1 ms


def test_our_longest_tokens_pass_the_shape_check():
    issuer = TokenIssuer(SECRET, lifetime=3600)
    name, device = "\u00e9" * 127, "\u2603" * 512
    assert len(issuer.issue(name, device)) <= MAX_TOKEN_LENGTH
    assert issuer.verify(issuer.issue(name, device)).device_id == device


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=30,
)
segments = (
    st.binary(max_size=300).map(b64)
    | json_values.map(lambda v: b64(json.dumps(v).encode()))
    | st.integers(0, 3000).map(lambda n: b64(b"[" * n))
    | st.text(max_size=40)
)


@settings(max_examples=400, deadline=None, database=None)
@given(
    token=st.text(max_size=300)
    | st.binary(max_size=300).map(lambda raw: raw.decode("utf-8", "surrogateescape"))
    | st.lists(segments, min_size=1, max_size=4).map(".".join)
)
def test_any_text_is_claims_or_a_token_error(token):
    issuer = TokenIssuer(SECRET, cache_ttl=0)
    try:
        issuer.verify(token)
    except TokenError:
        pass
