"""What every FactorStore must do (backends/sessions/factors.py), as tests over a
`factor_store` fixture: a store's test module subclasses FactorStoreContract and gives the
fixture (test_memory_store.py; stage 2: SQLite and Redis). Uses of one code, counter or
challenge at once: exactly one wins."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from backends.sessions.factors import RECOVERY, TOTP, WEBAUTHN, Challenge, Factor

NOW = int(time.time() * 1000)


def app(user: str = "alice", factor_id: str = "t1", **extra) -> Factor:
    return Factor(factor_id=factor_id, user=user, kind=TOTP, name="Phone", created_ts=NOW,
                  sealed_secret=b"\x01sealed\x00bytes\xff", **extra)


def key(user: str = "alice", factor_id: str = "p1", credential_id: bytes = b"cred-1", **extra) -> Factor:
    return Factor(factor_id=factor_id, user=user, kind=WEBAUTHN, name="Key", created_ts=NOW,
                  credential_id=credential_id, public_key=b"\xa5cose", transports=("usb", "nfc"), **extra)


def codes(user: str = "alice", factor_id: str = "r1", hashes: tuple[str, ...] = ("h1", "h2", "h3")) -> Factor:
    return Factor(factor_id=factor_id, user=user, kind=RECOVERY, name="Recovery codes", created_ts=NOW,
                  code_hashes=hashes)


class FactorStoreContract:
    async def test_factors_are_kept_whole_and_listed_oldest_first(self, factor_store):
        kept = [app(), key(), codes()]
        for factor in kept:
            assert await factor_store.add_factor(factor)
        assert await factor_store.factors("alice") == kept
        assert await factor_store.factors("bob") == []
        assert await factor_store.factor("alice", "p1") == kept[1]
        assert await factor_store.factor("bob", "p1") is None
        assert await factor_store.factor("alice", "nope") is None

    async def test_an_id_or_a_persons_credential_is_added_once(self, factor_store):
        assert await factor_store.add_factor(app())
        assert not await factor_store.add_factor(replace(app(), name="Other"))
        assert await factor_store.add_factor(key())
        assert not await factor_store.add_factor(key(factor_id="p2"))  # same credential id
        assert await factor_store.add_factor(key(user="bob", factor_id="p3"))  # another person's
        assert [f.name for f in await factor_store.factors("alice")] == ["Phone", "Key"]

    async def test_removing_one_or_all(self, factor_store):
        for factor in (app(), key(), codes(), app(user="bob", factor_id="b1")):
            await factor_store.add_factor(factor)
        assert not await factor_store.remove_factor("bob", "t1")  # not bob's
        assert await factor_store.remove_factor("alice", "t1")
        assert not await factor_store.remove_factor("alice", "t1")
        assert await factor_store.remove_all("alice") == 2
        assert await factor_store.factors("alice") == []
        assert await factor_store.remove_all("alice") == 0
        assert len(await factor_store.factors("bob")) == 1

    async def test_keep_one_removes_no_last_app_or_passkey(self, factor_store):
        for factor in (app(), key(), codes()):
            await factor_store.add_factor(factor)
        assert await factor_store.remove_factor("alice", "r1", keep_one=True)  # codes: apps are left
        assert await factor_store.remove_factor("alice", "t1", keep_one=True)
        assert not await factor_store.remove_factor("alice", "p1", keep_one=True)  # the last one
        assert not await factor_store.remove_factor("alice", "gone", keep_one=True)
        assert [f.factor_id for f in await factor_store.factors("alice")] == ["p1"]
        assert await factor_store.remove_factor("alice", "p1")
        await factor_store.add_factor(app(user="carol", factor_id="c1"))
        await factor_store.add_factor(key(user="carol", factor_id="c2"))
        results = await asyncio.gather(*(factor_store.remove_factor("carol", f"c{i}", keep_one=True) for i in (1, 2)))
        assert sorted(results) == [False, True]
        assert len(await factor_store.factors("carol")) == 1

    async def test_the_last_app_or_passkey_takes_the_recovery_codes_with_it(self, factor_store):
        for factor in (app(), key(), codes()):
            await factor_store.add_factor(factor)
        assert await factor_store.remove_factor("alice", "t1")
        assert [f.factor_id for f in await factor_store.factors("alice")] == ["p1", "r1"]
        assert await factor_store.remove_factor("alice", "p1")  # the last: the codes go in the same step
        assert await factor_store.factors("alice") == []
        await factor_store.add_factor(app(user="bob", factor_id="b1"))
        await factor_store.add_factor(codes(user="bob", factor_id="b2"))
        assert await factor_store.remove_factor("bob", "b2")  # the codes alone
        assert [f.factor_id for f in await factor_store.factors("bob")] == ["b1"]

    async def test_a_totp_step_is_accepted_once_and_only_forwards(self, factor_store):
        await factor_store.add_factor(app(last_step=100))
        assert not await factor_store.accept_totp_step("alice", "t1", 100, NOW + 1)
        assert not await factor_store.accept_totp_step("alice", "t1", 99, NOW + 1)
        assert await factor_store.accept_totp_step("alice", "t1", 101, NOW + 2)
        assert not await factor_store.accept_totp_step("alice", "t1", 101, NOW + 3)
        found = await factor_store.factor("alice", "t1")
        assert (found.last_step, found.last_used_ts) == (101, NOW + 2)
        assert not await factor_store.accept_totp_step("bob", "t1", 200, NOW)
        assert not await factor_store.accept_totp_step("alice", "gone", 200, NOW)

    async def test_of_two_uses_of_one_step_at_once_one_wins(self, factor_store):
        await factor_store.add_factor(app())
        results = await asyncio.gather(*(factor_store.accept_totp_step("alice", "t1", 7, NOW) for _ in range(8)))
        assert sorted(results) == [False] * 7 + [True]

    async def test_a_sealed_secret_is_replaced(self, factor_store):
        await factor_store.add_factor(app())
        assert await factor_store.update_sealed_secret("alice", "t1", b"\x01new")
        assert (await factor_store.factor("alice", "t1")).sealed_secret == b"\x01new"
        assert not await factor_store.update_sealed_secret("bob", "t1", b"x")

    async def test_a_sign_count_must_grow_unless_both_are_zero(self, factor_store):
        await factor_store.add_factor(key(sign_count=5))
        assert not await factor_store.accept_sign_count("alice", "p1", 5, NOW)
        assert not await factor_store.accept_sign_count("alice", "p1", 4, NOW)
        assert await factor_store.accept_sign_count("alice", "p1", 6, NOW + 9)
        found = await factor_store.factor("alice", "p1")
        assert (found.sign_count, found.last_used_ts) == (6, NOW + 9)
        await factor_store.add_factor(key(factor_id="p2", credential_id=b"synced"))
        assert await factor_store.accept_sign_count("alice", "p2", 0, NOW)
        assert await factor_store.accept_sign_count("alice", "p2", 0, NOW)
        assert not await factor_store.accept_sign_count("bob", "p2", 9, NOW)

    async def test_a_recovery_code_is_used_once(self, factor_store):
        await factor_store.set_recovery_codes(codes())
        assert await factor_store.use_recovery_code("alice", "h2", NOW + 5)
        assert not await factor_store.use_recovery_code("alice", "h2", NOW + 6)
        assert not await factor_store.use_recovery_code("alice", "nope", NOW + 6)
        assert not await factor_store.use_recovery_code("bob", "h1", NOW + 6)
        (found,) = await factor_store.factors("alice")
        assert (found.code_hashes, found.last_used_ts) == (("h1", "h3"), NOW + 5)
        results = await asyncio.gather(*(factor_store.use_recovery_code("alice", "h1", NOW) for _ in range(8)))
        assert sorted(results) == [False] * 7 + [True]

    async def test_new_recovery_codes_replace_the_old(self, factor_store):
        await factor_store.add_factor(app())
        await factor_store.set_recovery_codes(codes())
        await factor_store.set_recovery_codes(codes(factor_id="r2", hashes=("n1",)))
        assert not await factor_store.use_recovery_code("alice", "h1", NOW)
        assert [(f.factor_id, f.code_hashes) for f in await factor_store.factors("alice") if f.kind == RECOVERY] == [
            ("r2", ("n1",))]

    async def test_recovery_codes_are_added_only_to_a_person_without_a_set(self, factor_store):
        await factor_store.add_factor(app())
        assert await factor_store.add_recovery_codes(codes())
        assert not await factor_store.add_recovery_codes(codes(factor_id="r2", hashes=("n1",)))
        assert not await factor_store.add_recovery_codes(codes(user="bob", factor_id="r3"))  # no app nor passkey
        await factor_store.add_factor(key(user="bob", factor_id="b1"))
        assert await factor_store.add_recovery_codes(codes(user="bob", factor_id="r3"))
        await factor_store.add_factor(app(user="carol", factor_id="c"))
        assert [(f.factor_id, f.code_hashes) for f in await factor_store.factors("alice")][1:] == [
            ("r1", ("h1", "h2", "h3"))]
        results = await asyncio.gather(
            *(factor_store.add_recovery_codes(codes(user="carol", factor_id=f"c{i}")) for i in range(8))
        )
        assert sorted(results) == [False] * 7 + [True]
        assert len(await factor_store.factors("carol")) == 2

    async def test_a_challenge_is_taken_once_and_not_after_it_expires(self, factor_store):
        # Against the store's clock now (NOW was taken at import, minutes ago in a long run).
        now = int(time.time() * 1000)
        live = Challenge("alice", "register", b"c" * 32, now + 60_000)
        await factor_store.add_challenge(live)
        assert await factor_store.take_challenge("unknown") is None
        results = await asyncio.gather(*(factor_store.take_challenge(live.key) for _ in range(4)))
        assert [r for r in results if r is not None] == [live]
        expired = Challenge("alice", "authenticate", b"d" * 32, now - 1)
        await factor_store.add_challenge(expired)
        assert await factor_store.take_challenge(expired.key) is None


def test_records_survive_their_text_form():
    for factor in (app(last_step=3), key(sign_count=9), codes()):
        assert Factor.decode(factor.encode()) == factor
    challenge = Challenge("alice", "authenticate", b"\x00\xff" * 16, NOW)
    assert Challenge.decode(challenge.encode()) == challenge
