"""The second-factor service as the account page and the sign-in's second step will call it:
adding apps and passkeys, recovery codes, and the checks, over the in-memory FactorStore."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

import pytest

from backends.sessions.factors import RECOVERY, TOTP, WEBAUTHN
from homeserver.config import build_config
from homeserver.mfa import totp
from homeserver.mfa.limits import TooManyWrongCodes, WrongCodeLimit
from homeserver.mfa.passkeys import RelyingParty
from homeserver.mfa.sealing import Keyring, associated_data
from homeserver.mfa.service import EnrolmentExpired, PasskeyError, SecondFactors, WrongCode, issuer_of
from tests.mfa.authenticator import SoftAuthenticator
from tests.mfa.memory_store import MemoryFactorStore

KEY = "the operator's key, at least 32 bytes"
RP = RelyingParty.from_base_url("https://matrix.example.org", "example.org")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(clock):
    return MemoryFactorStore(clock)


@pytest.fixture
def seen():
    return []


@pytest.fixture
def mfa(store, clock, seen):
    limit = WrongCodeLimit(1 / 60, 3, None, clock=clock)
    return SecondFactors(store, Keyring(KEY), limit, issuer="example.org", relying_party=RP, clock=clock,
                         observer=lambda kind, ok: seen.append((kind, ok)))


def code_now(secret: str, clock: Clock, offset: int = 0) -> str:
    return totp.code_at(secret, totp.current_step(clock.now) + offset)


async def add_app(mfa: SecondFactors, clock: Clock, user: str = "alice"):
    enrolment = await mfa.begin_totp(user)
    added = await mfa.finish_totp(user, enrolment.pending, code_now(enrolment.secret, clock), "Phone")
    return enrolment.secret, added


# -- adding an authenticator app --------------------------------------------------------------------

async def test_an_app_is_added_with_its_first_code_and_the_recovery_codes_come_once(mfa, store, clock):
    enrolment = await mfa.begin_totp("alice")
    assert await store.factors("alice") == []  # nothing kept before the first code
    assert parse_qs(urlsplit(enrolment.uri).query)["secret"] == [enrolment.secret]
    assert enrolment.uri.startswith("otpauth://totp/example.org:alice?")
    assert enrolment.qr_svg.startswith("<svg") and "style" not in enrolment.qr_svg
    assert enrolment.secret not in enrolment.pending
    added = await mfa.finish_totp("alice", enrolment.pending, code_now(enrolment.secret, clock), " Phone\n")
    assert (added.factor.kind, added.factor.name, added.factor.last_used_ts) == (TOTP, "Phone", 0)
    assert len(added.recovery_codes) == 10
    (app, codes) = await store.factors("alice")
    assert app == added.factor and codes.kind == RECOVERY and len(codes.code_hashes) == 10
    assert enrolment.secret.encode() not in app.sealed_secret
    assert Keyring(KEY).open(app.sealed_secret, associated_data(TOTP, "alice", app.factor_id)) == enrolment.secret.encode()
    assert await mfa.has_factor("alice") and not await mfa.has_factor("bob")
    _, second = await add_app(mfa, clock)
    assert second.recovery_codes == []  # not the first factor: the codes stay as they were


async def test_the_confirming_code_cannot_pass_a_sign_in(mfa, clock):
    enrolment = await mfa.begin_totp("alice")
    code = code_now(enrolment.secret, clock)
    await mfa.finish_totp("alice", enrolment.pending, code)
    with pytest.raises(WrongCode, match="used before"):
        await mfa.check_code("alice", code)


async def test_the_same_form_sent_twice_adds_the_app_once(mfa, store, clock):
    enrolment = await mfa.begin_totp("alice")
    first = await mfa.finish_totp("alice", enrolment.pending, code_now(enrolment.secret, clock))
    clock.now += 30
    again = await mfa.finish_totp("alice", enrolment.pending, code_now(enrolment.secret, clock))
    assert again.factor == first.factor and again.recovery_codes == []
    assert [f.kind for f in await store.factors("alice")] == [TOTP, RECOVERY]


async def test_a_wrong_first_code_adds_nothing(mfa, store, clock):
    enrolment = await mfa.begin_totp("alice")
    with pytest.raises(WrongCode):
        await mfa.finish_totp("alice", enrolment.pending, code_now(enrolment.secret, clock, 5))
    assert await store.factors("alice") == []


@pytest.mark.parametrize("how", ["too late", "another person", "tampered", "garbage"])
async def test_a_stale_or_foreign_form_is_refused(mfa, clock, how):
    enrolment = await mfa.begin_totp("alice")
    user, pending = "alice", enrolment.pending
    if how == "too late":
        clock.now += 901
    elif how == "another person":
        user = "bob"
    elif how == "tampered":
        pending = pending[:-2] + ("AA" if pending[-2:] != "AA" else "BB")
    else:
        pending = "!!not base64"
    with pytest.raises(EnrolmentExpired):
        await mfa.finish_totp(user, pending, code_now(enrolment.secret, clock))


# -- the second step with a code ----------------------------------------------------------------------

async def test_a_code_passes_once_and_the_next_one_too(mfa, clock, seen):
    secret, added = await add_app(mfa, clock)
    clock.now += 30
    code = code_now(secret, clock)
    passed = await mfa.check_code("alice", code)
    assert (passed.factor_id, passed.kind, passed.recovery_left) == (added.factor.factor_id, TOTP, None)
    with pytest.raises(WrongCode, match="used before"):
        await mfa.check_code("alice", code)
    clock.now += 30
    await mfa.check_code("alice", code_now(secret, clock))
    assert seen == [(TOTP, True), (TOTP, False), (TOTP, True)]


async def test_a_code_of_an_earlier_step_after_a_later_one_is_refused(mfa, clock):
    secret, _ = await add_app(mfa, clock)
    clock.now += 60
    await mfa.check_code("alice", code_now(secret, clock, +1))
    with pytest.raises(WrongCode):
        await mfa.check_code("alice", code_now(secret, clock, -1))


async def test_any_of_the_persons_apps_passes(mfa, clock):
    await add_app(mfa, clock)
    clock.now += 30
    other, added = await add_app(mfa, clock)
    clock.now += 30
    assert (await mfa.check_code("alice", code_now(other, clock))).factor_id == added.factor.factor_id


async def test_a_code_passes_for_its_person_only(mfa, clock):
    secret, _ = await add_app(mfa, clock)
    await add_app(mfa, clock, "bob")
    clock.now += 30
    with pytest.raises(WrongCode):
        await mfa.check_code("bob", code_now(secret, clock))


async def test_of_two_sign_ins_with_one_code_at_once_one_passes(mfa, clock):
    secret, _ = await add_app(mfa, clock)
    clock.now += 30
    code = code_now(secret, clock)
    results = await asyncio.gather(*(mfa.check_code("alice", code) for _ in range(4)), return_exceptions=True)
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, WrongCode) for r in results if isinstance(r, Exception))


async def test_recovery_codes_pass_once_each_however_typed(mfa, clock, seen):
    _, added = await add_app(mfa, clock)
    first, second = added.recovery_codes[:2]
    passed = await mfa.check_code("alice", first.upper().replace("-", " "))
    assert (passed.kind, passed.recovery_left) == (RECOVERY, 9)
    with pytest.raises(WrongCode):
        await mfa.check_code("alice", first)
    assert (await mfa.check_code("alice", second)).recovery_left == 8
    assert seen[-3:] == [(RECOVERY, True), (RECOVERY, False), (RECOVERY, True)]


async def test_renewed_recovery_codes_replace_the_old(mfa, clock):
    _, added = await add_app(mfa, clock)
    renewed = await mfa.renew_recovery_codes("alice")
    assert set(renewed).isdisjoint(added.recovery_codes)
    with pytest.raises(WrongCode):
        await mfa.check_code("alice", added.recovery_codes[0])
    assert (await mfa.check_code("alice", renewed[0])).recovery_left == 9


async def test_wrong_codes_are_limited_per_person_and_audited_without_the_code(mfa, clock, caplog):
    secret, added = await add_app(mfa, clock)
    clock.now += 30
    with caplog.at_level(logging.INFO, logger="homeserver.audit"):
        for wrong in ("000000", "not a code", "abcd-efgh-jkmn"):
            with pytest.raises(WrongCode):
                await mfa.check_code("alice", wrong)
        with pytest.raises(TooManyWrongCodes) as caught:
            await mfa.check_code("alice", code_now(secret, clock))  # the right one, over the limit
    assert 55 < caught.value.retry_after <= 60
    lines = [r.getMessage() for r in caplog.records if r.name == "homeserver.audit"]
    assert len(lines) == 4 and all('user="alice"' in line and "outcome=" in line for line in lines)
    assert "too many wrong codes" in lines[-1]
    for secret_text in ("000000", "not a code", "abcd", secret, added.recovery_codes[0], code_now(secret, clock)):
        assert secret_text not in caplog.text
    await add_app(mfa, clock, "bob")  # another person is not limited by it
    clock.now += 60
    await mfa.check_code("alice", code_now(secret, clock))


async def test_after_a_key_rotation_a_secret_opens_and_is_sealed_again(store, clock):
    limit = WrongCodeLimit(1, 5, None, clock=clock)
    before = SecondFactors(store, Keyring("the key before the rotation, 32 bytes"), limit, issuer="x",
                           relying_party=RP, clock=clock)
    secret, added = await add_app(before, clock)
    after = SecondFactors(store, Keyring(KEY, ["the key before the rotation, 32 bytes"]), limit, issuer="x",
                          relying_party=RP, clock=clock)
    clock.now += 30
    await after.check_code("alice", code_now(secret, clock))
    (app, _) = await store.factors("alice")
    assert after.keys.is_current(app.sealed_secret) and not before.keys.is_current(app.sealed_secret)
    assert (await after.check_code("alice", added.recovery_codes[0])).kind == RECOVERY  # kept before, found after


async def test_a_secret_no_key_opens_is_logged_and_refused(store, clock, caplog):
    limit = WrongCodeLimit(1, 5, None, clock=clock)
    old = SecondFactors(store, Keyring("a key that the operator then lost!!"), limit, issuer="x",
                        relying_party=None, clock=clock)
    secret, _ = await add_app(old, clock)
    new = SecondFactors(store, Keyring(KEY), limit, issuer="x", relying_party=None, clock=clock)
    clock.now += 30
    with caplog.at_level(logging.ERROR), pytest.raises(WrongCode):
        await new.check_code("alice", code_now(secret, clock))
    assert "previous_keys" in caplog.text and secret not in caplog.text


# -- managing -------------------------------------------------------------------------------------------

async def test_removing_the_last_factor_removes_the_recovery_codes(mfa, store, clock):
    _, one = await add_app(mfa, clock)
    _, two = await add_app(mfa, clock)
    assert not await mfa.remove("bob", one.factor.factor_id)
    assert await mfa.remove("alice", one.factor.factor_id)
    assert [f.kind for f in await store.factors("alice")] == [RECOVERY, TOTP]
    assert await mfa.remove("alice", two.factor.factor_id)
    assert await store.factors("alice") == [] and not await mfa.has_factor("alice")


async def test_a_reset_removes_everything_and_is_audited(mfa, clock, caplog):
    await add_app(mfa, clock)
    await add_app(mfa, clock, "bob")
    with caplog.at_level(logging.INFO, logger="homeserver.audit"):
        assert await mfa.reset("alice") == 2
    assert 'audit factors_reset user="alice"' in caplog.text and "count=2" in caplog.text
    assert await mfa.factors("alice") == [] and await mfa.has_factor("bob")


# -- passkeys ----------------------------------------------------------------------------------------------

async def add_passkey(mfa: SecondFactors, user: str = "alice") -> tuple[SoftAuthenticator, object]:
    auth = SoftAuthenticator(origin=RP.origin, rp_id=RP.rp_id)
    options = await mfa.begin_passkey(user, "Alice")
    return auth, await mfa.finish_passkey(user, auth.create(options), "Laptop")


async def test_a_passkey_is_added_and_passes_the_second_step(mfa, store, seen):
    auth, added = await add_passkey(mfa)
    assert (added.factor.kind, added.factor.name, added.factor.transports) == (WEBAUTHN, "Laptop", ("internal",))
    assert len(added.recovery_codes) == 10
    options = await mfa.begin_passkey_check("alice")
    assert json.loads(options)["allowCredentials"][0]["id"]
    passed = await mfa.finish_passkey_check("alice", auth.get(options))
    assert (passed.factor_id, passed.kind) == (added.factor.factor_id, WEBAUTHN)
    kept = await store.factor("alice", added.factor.factor_id)
    assert kept.sign_count == 1 and kept.last_used_ts > 0
    assert seen == [(WEBAUTHN, True)]


async def test_an_answer_is_good_once(mfa):
    auth, _ = await add_passkey(mfa)
    options = await mfa.begin_passkey_check("alice")
    answer = auth.get(options)
    await mfa.finish_passkey_check("alice", answer)
    with pytest.raises(PasskeyError, match="challenge"):
        await mfa.finish_passkey_check("alice", answer)


async def test_a_refused_answer_uses_up_its_challenge(mfa):
    auth, _ = await add_passkey(mfa)
    options = await mfa.begin_passkey_check("alice")
    with pytest.raises(PasskeyError, match="assertion refused"):
        await mfa.finish_passkey_check("alice", auth.get(options, origin="https://evil.example"))
    with pytest.raises(PasskeyError, match="challenge"):
        await mfa.finish_passkey_check("alice", auth.get(options))


async def test_a_challenge_expires(mfa, clock):
    auth, _ = await add_passkey(mfa)
    options = await mfa.begin_passkey_check("alice")
    clock.now += 301
    with pytest.raises(PasskeyError, match="challenge"):
        await mfa.finish_passkey_check("alice", auth.get(options))


async def test_a_removed_or_another_persons_passkey_does_not_pass(mfa):
    alices, added = await add_passkey(mfa)
    bobs, _ = await add_passkey(mfa, "bob")
    options = await mfa.begin_passkey_check("alice")
    with pytest.raises(PasskeyError, match="not a passkey of this person"):
        await mfa.finish_passkey_check("alice", bobs.get(options))
    await add_app_for_passkey_user(mfa)
    await mfa.remove("alice", added.factor.factor_id)
    assert await mfa.begin_passkey_check("alice") is None
    options = await mfa.begin_passkey_check("bob")
    with pytest.raises(PasskeyError):
        await mfa.finish_passkey_check("alice", alices.get(options))


async def add_app_for_passkey_user(mfa: SecondFactors) -> None:
    enrolment = await mfa.begin_totp("alice")
    await mfa.finish_totp("alice", enrolment.pending, code_now(enrolment.secret, mfa.clock))


async def test_a_passkey_is_added_once_and_an_answer_for_another_person_is_refused(mfa):
    auth, _ = await add_passkey(mfa)
    options = await mfa.begin_passkey("alice")
    assert json.loads(options)["excludeCredentials"]
    with pytest.raises(PasskeyError, match="added already"):
        await mfa.finish_passkey("alice", auth.create(options))
    options = await mfa.begin_passkey("alice")
    with pytest.raises(PasskeyError, match="challenge"):
        await mfa.finish_passkey("bob", SoftAuthenticator(origin=RP.origin, rp_id=RP.rp_id).create(options))


async def test_without_a_relying_party_passkeys_are_off(store, clock):
    mfa = SecondFactors(store, Keyring(KEY), WrongCodeLimit(1, 5, None, clock=clock), issuer="x",
                        relying_party=SecondFactors.relying_party_of("http://127.0.0.1:8008", "x"), clock=clock)
    with pytest.raises(PasskeyError, match="passkeys are off"):
        await mfa.begin_passkey("alice")
    await add_app(mfa, clock)
    assert await mfa.begin_passkey_check("alice") is None


async def test_passkeys_are_not_held_back_by_the_wrong_code_limit(mfa, clock):
    auth, _ = await add_passkey(mfa)
    for _ in range(3):
        with pytest.raises(WrongCode):
            await mfa.check_code("alice", "000000")
    with pytest.raises(TooManyWrongCodes):
        await mfa.check_code("alice", "000000")
    options = await mfa.begin_passkey_check("alice")
    await mfa.finish_passkey_check("alice", auth.get(options))


async def test_a_cloned_authenticators_stale_counter_is_refused(mfa, store):
    auth, added = await add_passkey(mfa)
    for _ in range(2):
        await mfa.finish_passkey_check("alice", auth.get(await mfa.begin_passkey_check("alice")))
    clone = replace(auth, sign_count=0)
    with pytest.raises(PasskeyError, match="sign count"):
        await mfa.finish_passkey_check("alice", clone.get(await mfa.begin_passkey_check("alice")))
    assert (await store.factor("alice", added.factor.factor_id)).sign_count == 2


# -- from the config ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "server_name", "issuer"), [
    ({}, "example.org", "example.org"),
    ({}, "example.org:8448", "example.org"),
    ({}, "[::1]:8448", "[::1]"),
    ({"issuer": "Example Chat"}, "example.org:8448", "Example Chat"),
])
def test_the_issuer(section, server_name, issuer):
    config = build_config({"mfa": section, "server": {"server_name": server_name}}, environ={})
    assert issuer_of(config) == issuer


async def test_the_service_from_the_config(tmp_path, store, caplog):
    document = {"server": {"base_url": "https://matrix.example.org", "server_name": "example.org"},
                "mfa": {"failed_codes_burst": 2}}
    mfa = SecondFactors.from_config(build_config(document, path=str(tmp_path / "h.toml"), environ={}), store, None)
    assert (tmp_path / "mfa.key").exists()
    assert mfa.issuer == "example.org"
    assert mfa.relying_party == RelyingParty("matrix.example.org", "https://matrix.example.org", "example.org")
    assert mfa.limit.local.capacity == 2 * mfa.limit.local.interval
    enrolment = await mfa.begin_totp("alice")
    assert enrolment.uri.startswith("otpauth://totp/example.org:alice?")
    with caplog.at_level(logging.WARNING):
        config = build_config({"server": {"host": "10.0.0.5"}}, path=str(tmp_path / "h.toml"), environ={})
        by_address = SecondFactors.from_config(config, store, None)
    assert by_address.relying_party is None and "passkeys are off" in caplog.text
