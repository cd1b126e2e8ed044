"""Authenticator-app codes (RFC 6238): the link apps read, the window, and the matched step
the caller uses to refuse a replay."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, unquote, urlsplit

import pyotp
import pytest

from homeserver.mfa import totp

# RFC 6238 appendix B: the SHA-1 seed "12345678901234567890" and its 8-digit codes; a 6-digit
# code is the last six digits of the same number.
RFC_SECRET = base64.b32encode(b"12345678901234567890").decode("ascii")
RFC_VECTORS = [(59, "94287082"), (1111111109, "07081804"), (1111111111, "14050471"), (1234567890, "89005924"),
               (2000000000, "69279037"), (20000000000, "65353130")]


@pytest.mark.parametrize(("when", "code"), RFC_VECTORS)
def test_codes_are_rfc_6238s(when, code):
    step = totp.current_step(when)
    assert totp.code_at(RFC_SECRET, step) == code[-6:]
    assert totp.matching_step(RFC_SECRET, code[-6:], when) == step


def test_a_new_secret_is_160_random_bits_of_base32():
    secrets = {totp.new_secret() for _ in range(50)}
    assert len(secrets) == 50
    for secret in secrets:
        assert len(base64.b32decode(secret)) == 20


def test_the_link_names_the_server_and_the_person_and_holds_the_secret():
    secret = totp.new_secret()
    uri = totp.provisioning_uri(secret, "alice", "example.org")
    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc) == ("otpauth", "totp")
    assert unquote(parts.path) == "/example.org:alice"
    query = parse_qs(parts.query)
    assert query["secret"] == [secret]
    assert query["issuer"] == ["example.org"]
    # What an app does with it: pyotp's own parser gives back a generator of the same codes.
    parsed = pyotp.parse_uri(uri)
    assert parsed.now() == pyotp.TOTP(secret).now()


def test_a_colon_in_the_server_name_does_not_split_the_label():
    uri = totp.provisioning_uri(totp.new_secret(), "alice", "example.org:8448")
    label = unquote(urlsplit(uri).path)[1:]
    assert label.count(":") == 1
    assert label == "example.org 8448:alice"
    assert parse_qs(urlsplit(uri).query)["issuer"] == ["example.org 8448"]


def test_odd_characters_in_names_are_percent_encoded():
    uri = totp.provisioning_uri(totp.new_secret(), "ren\u00e9 & co/x?y", "Hôme server")
    assert " " not in uri and "&" not in urlsplit(uri).path and "?" not in urlsplit(uri).path
    assert unquote(urlsplit(uri).path) == "/Hôme server:ren\u00e9 & co/x?y"


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_codes_of_one_step_either_side_pass_and_say_their_step(offset):
    secret = totp.new_secret()
    now = 1_700_000_015.0
    step = totp.current_step(now) + offset
    assert totp.matching_step(secret, totp.code_at(secret, step), now) == step


@pytest.mark.parametrize("offset", [-3, -2, 2, 3])
def test_codes_outside_the_window_do_not_pass(offset):
    secret = totp.new_secret()
    now = 1_700_000_015.0
    code = totp.code_at(secret, totp.current_step(now) + offset)
    within = {totp.code_at(secret, totp.current_step(now) + d) for d in (-1, 0, 1)}
    if code in within:  # one in a million: the same code twice in five steps
        pytest.skip("the code repeats within the window")
    assert totp.matching_step(secret, code, now) is None


def test_a_replay_is_seen_by_its_step():
    """The caller refuses a step not newer than the last accepted one: the same code, typed
    again within its window, matches the same step."""
    secret = totp.new_secret()
    now = 1_700_000_000.0
    code = totp.code_at(secret, totp.current_step(now))
    first = totp.matching_step(secret, code, now)
    again = totp.matching_step(secret, code, now + 29)
    assert first is not None and again == first


@pytest.mark.parametrize("typed", ["123 456", " 123456 ", "123-456", "123.456", "123\u00a0456"])
def test_spaces_and_a_middle_separator_are_forgiven(typed):
    assert totp.normalize_code(typed) == "123456"


@pytest.mark.parametrize("typed", ["", "12345", "1234567", "12345a", "١٢٣٤٥٦", "123456" * 20, "12 34 5"])
def test_what_cannot_be_a_code_matches_nothing(typed):
    assert totp.normalize_code(typed) is None
    assert totp.matching_step(totp.new_secret(), typed) is None


def test_a_wrong_code_matches_nothing():
    secret = totp.new_secret()
    now = 1_700_000_000.0
    window = {totp.code_at(secret, totp.current_step(now) + d) for d in (-1, 0, 1)}
    wrong = next(f"{n:06d}" for n in range(1_000_000) if f"{n:06d}" not in window)
    assert totp.matching_step(secret, wrong, now) is None


def test_the_clock_is_read_when_no_time_is_given():
    secret = totp.new_secret()
    assert totp.matching_step(secret, pyotp.TOTP(secret).now()) is not None
