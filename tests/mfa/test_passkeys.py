"""Passkeys as a second factor (py_webauthn), without a browser: a software authenticator
(tests/mfa/authenticator.py) answers the options, and the checks pass or refuse its answers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.sessions.factors import AUTHENTICATE, REGISTER, TOTP, WEBAUTHN, Factor
from homeserver.mfa import passkeys
from homeserver.mfa.passkeys import PasskeyError, PasskeysUnavailable, RelyingParty
from tests.mfa.authenticator import AT, UP, UV, SoftAuthenticator, b64url, unb64url

RP = RelyingParty.from_base_url("https://matrix.example.org/", "example.org")
NOW = 1_700_000_000_000
HANDLE = b"h" * 16


def passkey_factor(auth: SoftAuthenticator, user: str = "alice", factor_id: str = "p1") -> Factor:
    """Register `auth` and return the Factor the service would keep."""
    options, challenge = passkeys.registration_options(RP, user, "Alice", HANDLE, [], NOW)
    new = passkeys.verify_registration(RP, challenge, user, auth.create(options), NOW)
    return Factor(factor_id=factor_id, user=user, kind=WEBAUTHN, name="Key", created_ts=NOW,
                  credential_id=new.credential_id, public_key=new.public_key, sign_count=new.sign_count,
                  transports=new.transports)


def soft() -> SoftAuthenticator:
    return SoftAuthenticator(origin=RP.origin, rp_id=RP.rp_id)


# -- the relying party ------------------------------------------------------------------------

@pytest.mark.parametrize(("base_url", "rp_id", "origin"), [
    ("https://matrix.example.org/", "matrix.example.org", "https://matrix.example.org"),
    ("https://Matrix.Example.org:443/prefix", "matrix.example.org", "https://matrix.example.org"),
    ("https://matrix.example.org:8448", "matrix.example.org", "https://matrix.example.org:8448"),
    ("http://localhost:8008", "localhost", "http://localhost:8008"),
    ("http://localhost:80/", "localhost", "http://localhost"),
])
def test_the_relying_party_is_the_base_urls_host_and_origin(base_url, rp_id, origin):
    rp = RelyingParty.from_base_url(base_url, "")
    assert (rp.rp_id, rp.origin, rp.name) == (rp_id, origin, rp_id)


@pytest.mark.parametrize("base_url", ["http://127.0.0.1:8008", "http://[::1]:8008/", "https://10.0.0.1", "ftp://x", "/"])
def test_an_ip_address_or_no_host_cannot_be_a_relying_party(base_url):
    with pytest.raises(PasskeysUnavailable):
        RelyingParty.from_base_url(base_url, "x")


# -- registration ------------------------------------------------------------------------------

def test_registration_options_ask_for_any_authenticator_and_exclude_the_persons_passkeys():
    first = passkey_factor(soft())
    totp_factor = Factor(factor_id="t", user="alice", kind=TOTP, name="App", created_ts=NOW)
    options, challenge = passkeys.registration_options(RP, "alice", "Alice", HANDLE, [first, totp_factor], NOW)
    parsed = json.loads(options)
    assert parsed["rp"] == {"id": "matrix.example.org", "name": "example.org"}
    assert parsed["user"] == {"id": b64url(HANDLE), "name": "alice", "displayName": "Alice"}
    selection = parsed["authenticatorSelection"]
    assert "authenticatorAttachment" not in selection  # a phone, a key or the computer itself
    assert selection["userVerification"] == "preferred"
    assert selection["residentKey"] == "preferred"
    assert parsed["attestation"] == "none"
    assert parsed["excludeCredentials"] == [{"id": b64url(first.credential_id), "type": "public-key",
                                             "transports": ["internal"]}]
    assert unb64url(parsed["challenge"]) == challenge.challenge and len(challenge.challenge) >= 32
    assert (challenge.user, challenge.purpose) == ("alice", REGISTER)
    assert challenge.expires_ts == NOW + passkeys.CHALLENGE_LIFETIME_MS


def test_a_registration_is_verified_and_gives_the_key_to_keep():
    auth = soft()
    options, challenge = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    answer = auth.create(options)
    assert passkeys.challenge_key(answer) == challenge.key
    new = passkeys.verify_registration(RP, challenge, "alice", answer, NOW)
    assert new.credential_id == auth.credential_id
    assert new.public_key == auth.cose_key()
    assert (new.sign_count, new.transports) == (0, ("internal",))


@pytest.mark.parametrize("wrong", ["origin", "rp_id", "no user presence"])
def test_a_registration_from_elsewhere_is_refused(wrong):
    options, challenge = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    answer = {
        "origin": lambda: soft().create(options, origin="https://evil.example"),
        "rp_id": lambda: soft().create(options, rp_id="evil.example"),
        "no user presence": lambda: soft().create(options, flags=UV | AT),
    }[wrong]()
    with pytest.raises(PasskeyError, match="registration refused"):
        passkeys.verify_registration(RP, challenge, "alice", answer, NOW)


def test_a_registration_against_another_challenge_is_refused():
    options, _ = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    _, other = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    with pytest.raises(PasskeyError):
        passkeys.verify_registration(RP, other, "alice", soft().create(options), NOW)


def test_a_challenge_is_for_one_person_one_purpose_and_a_short_while():
    options, challenge = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    answer = soft().create(options)
    for user, now in (("bob", NOW), ("alice", challenge.expires_ts)):
        with pytest.raises(PasskeyError, match="challenge"):
            passkeys.verify_registration(RP, challenge, user, answer, now)
    factor = passkey_factor(soft())
    _, sign_in = passkeys.authentication_options(RP, "alice", [factor], NOW)
    with pytest.raises(PasskeyError, match="challenge"):
        passkeys.verify_registration(RP, sign_in, "alice", answer, NOW)


@pytest.mark.parametrize("answer", [
    "", "not json", "[]", "{}", '{"response": 1}', '{"response": {}}', "{" * 100_000,
    '{"id": "x", "rawId": "!!", "type": "public-key", "response": {"clientDataJSON": "", "attestationObject": ""}}',
    '{"id": "AA", "rawId": "AA", "type": "public-key", "response": {"clientDataJSON": "e30", "attestationObject": "oA"}}',
])
def test_garbage_is_refused_as_such(answer):
    _, challenge = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    with pytest.raises(PasskeyError):
        passkeys.verify_registration(RP, challenge, "alice", answer, NOW)
    with pytest.raises(PasskeyError):
        passkeys.challenge_key(answer)


# -- authentication ----------------------------------------------------------------------------

def test_authentication_options_allow_the_persons_passkeys_only():
    one, two = passkey_factor(soft(), factor_id="p1"), passkey_factor(soft(), factor_id="p2")
    totp_factor = Factor(factor_id="t", user="alice", kind=TOTP, name="App", created_ts=NOW)
    options, challenge = passkeys.authentication_options(RP, "alice", [one, totp_factor, two], NOW)
    parsed = json.loads(options)
    assert parsed["rpId"] == "matrix.example.org"
    assert [c["id"] for c in parsed["allowCredentials"]] == [b64url(one.credential_id), b64url(two.credential_id)]
    assert parsed["userVerification"] == "preferred"
    assert (challenge.user, challenge.purpose) == ("alice", AUTHENTICATE)
    with pytest.raises(PasskeyError):
        passkeys.authentication_options(RP, "alice", [totp_factor], NOW)


def test_an_assertion_is_verified_and_names_its_passkey_and_counter():
    auth, other = soft(), soft()
    factors = [passkey_factor(other, factor_id="p0"), passkey_factor(auth, factor_id="p1")]
    options, challenge = passkeys.authentication_options(RP, "alice", factors, NOW)
    answer = auth.get(options)
    assert passkeys.challenge_key(answer) == challenge.key
    use = passkeys.verify_authentication(RP, challenge, "alice", answer, factors, NOW)
    assert (use.factor.factor_id, use.sign_count) == ("p1", 1)


@pytest.mark.parametrize("wrong", ["origin", "rp_id", "no user presence", "another key signed"])
def test_an_assertion_from_elsewhere_is_refused(wrong):
    auth = soft()
    factors = [passkey_factor(auth)]
    options, challenge = passkeys.authentication_options(RP, "alice", factors, NOW)
    if wrong == "another key signed":
        impostor = soft()
        impostor.credential_id = auth.credential_id
        answer = impostor.get(options)
    else:
        answer = {
            "origin": lambda: auth.get(options, origin="https://matrix.example.org.evil.example"),
            "rp_id": lambda: auth.get(options, rp_id="example.org"),
            "no user presence": lambda: auth.get(options, flags=UV),
        }[wrong]()
    with pytest.raises(PasskeyError, match="assertion refused"):
        passkeys.verify_authentication(RP, challenge, "alice", answer, factors, NOW)


def test_an_assertion_of_a_credential_the_person_does_not_have_is_refused():
    alices, bobs = soft(), soft()
    alice = [passkey_factor(alices)]
    bob = [passkey_factor(bobs, user="bob")]
    options, challenge = passkeys.authentication_options(RP, "alice", alice, NOW)
    with pytest.raises(PasskeyError, match="not a passkey of this person"):
        passkeys.verify_authentication(RP, challenge, "alice", bobs.get(options), alice, NOW)
    with pytest.raises(PasskeyError, match="not a passkey of this person"):
        passkeys.verify_authentication(RP, challenge, "alice", alices.get(options, credential_id=b"x" * 16), alice, NOW)
    with pytest.raises(PasskeyError, match="challenge"):
        passkeys.verify_authentication(RP, challenge, "bob", bobs.get(options), bob, NOW)


def test_an_answer_to_another_challenge_is_refused():
    auth = soft()
    factors = [passkey_factor(auth)]
    options, _ = passkeys.authentication_options(RP, "alice", factors, NOW)
    _, other = passkeys.authentication_options(RP, "alice", factors, NOW)
    with pytest.raises(PasskeyError, match="assertion refused"):
        passkeys.verify_authentication(RP, other, "alice", auth.get(options), factors, NOW)


def test_a_counter_that_did_not_grow_is_refused_unless_the_authenticator_keeps_none():
    auth = soft()
    factor = passkey_factor(auth)
    options, challenge = passkeys.authentication_options(RP, "alice", [factor], NOW)
    use = passkeys.verify_authentication(RP, challenge, "alice", auth.get(options), [factor], NOW)
    kept = replace(factor, sign_count=use.sign_count)
    auth.sign_count = 0  # a clone of the authenticator, its counter behind
    options, challenge = passkeys.authentication_options(RP, "alice", [kept], NOW)
    with pytest.raises(PasskeyError, match="sign count"):
        passkeys.verify_authentication(RP, challenge, "alice", auth.get(options), [kept], NOW)

    synced = SoftAuthenticator(origin=RP.origin, rp_id=RP.rp_id, counts=False)
    factor = passkey_factor(synced)
    for _ in range(2):
        options, challenge = passkeys.authentication_options(RP, "alice", [factor], NOW)
        assert passkeys.verify_authentication(RP, challenge, "alice", synced.get(options), [factor], NOW).sign_count == 0


def test_flags_without_user_verification_still_pass():
    """User verification is preferred, not required: a security key without a PIN passes."""
    auth = soft()
    options, challenge = passkeys.registration_options(RP, "alice", "", HANDLE, [], NOW)
    passkeys.verify_registration(RP, challenge, "alice", auth.create(options, flags=UP | AT), NOW)
