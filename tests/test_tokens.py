"""Tokens: HS256 with a pinned algorithm list, and the generated-once secret."""

import os
import stat

import pytest

from homeserver.config import build_config
from homeserver.errors import ConfigError
from homeserver.tokens import ALGORITHMS, TokenError, TokenIssuer, load_secret

SECRET = "k" * 32


def test_round_trip_and_claims():
    issuer = TokenIssuer(SECRET)
    claims = issuer.verify(issuer.issue("alice", "DEV"))
    assert (claims.name, claims.device_id) == ("alice", "DEV")
    assert ALGORITHMS == ["HS256"]


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
