"""A FactorStore in a dict: the reference the store contract (store_contract.py) is written
against, and the fast store of the service's tests. Each method runs without an await, so
each is atomic, as the real stores' compare-and-set writes must be."""

from __future__ import annotations

import time
from dataclasses import replace

from backends.base import StoreUnavailable
from backends.sessions.factors import RECOVERY, WEBAUTHN, Challenge, Factor, FactorStore


class MemoryFactorStore(FactorStore):
    def __init__(self, clock=time.time) -> None:
        self._factors: dict[str, Factor] = {}  # factor_id -> factor, in insertion order
        self._challenges: dict[str, Challenge] = {}
        self.clock = clock
        self.down = False  # True: every call raises StoreUnavailable

    def _up(self) -> None:
        if self.down:
            raise StoreUnavailable("factor store down", store="session store")

    async def factors(self, user: str) -> list[Factor]:
        self._up()
        return [f for f in self._factors.values() if f.user == user]

    async def factor(self, user: str, factor_id: str) -> Factor | None:
        self._up()
        found = self._factors.get(factor_id)
        return found if found is not None and found.user == user else None

    async def add_factor(self, factor: Factor) -> bool:
        self._up()
        if factor.factor_id in self._factors:
            return False
        if factor.kind == WEBAUTHN and any(
            f.user == factor.user and f.kind == WEBAUTHN and f.credential_id == factor.credential_id
            for f in self._factors.values()
        ):
            return False
        self._factors[factor.factor_id] = factor
        return True

    async def remove_factor(self, user: str, factor_id: str, *, keep_one: bool = False) -> bool:
        self._up()
        if await self.factor(user, factor_id) is None:
            return False
        if keep_one and not any(
            f.user == user and f.kind != RECOVERY and f.factor_id != factor_id for f in self._factors.values()
        ):
            return False
        del self._factors[factor_id]
        if not any(f.user == user and f.kind != RECOVERY for f in self._factors.values()):
            for key in [k for k, f in self._factors.items() if f.user == user]:
                del self._factors[key]
        return True

    async def remove_all(self, user: str) -> int:
        self._up()
        gone = [k for k, f in self._factors.items() if f.user == user]
        for key in gone:
            del self._factors[key]
        return len(gone)

    async def set_recovery_codes(self, factor: Factor) -> None:
        self._up()
        for key in [k for k, f in self._factors.items() if f.user == factor.user and f.kind == RECOVERY]:
            del self._factors[key]
        self._factors[factor.factor_id] = factor

    async def add_recovery_codes(self, factor: Factor) -> bool:
        self._up()
        mine = [f for f in self._factors.values() if f.user == factor.user]
        if any(f.kind == RECOVERY for f in mine) or not mine:
            return False
        self._factors[factor.factor_id] = factor
        return True

    async def update_sealed_secret(self, user: str, factor_id: str, sealed_secret: bytes) -> bool:
        found = await self.factor(user, factor_id)
        if found is None:
            return False
        self._factors[factor_id] = replace(found, sealed_secret=sealed_secret)
        return True

    async def accept_totp_step(self, user: str, factor_id: str, step: int, now_ms: int) -> bool:
        found = await self.factor(user, factor_id)
        if found is None or step <= found.last_step:
            return False
        self._factors[factor_id] = replace(found, last_step=step, last_used_ts=now_ms)
        return True

    async def accept_sign_count(self, user: str, factor_id: str, sign_count: int, now_ms: int) -> bool:
        found = await self.factor(user, factor_id)
        if found is None or not (sign_count > found.sign_count or sign_count == found.sign_count == 0):
            return False
        self._factors[factor_id] = replace(found, sign_count=sign_count, last_used_ts=now_ms)
        return True

    async def use_recovery_code(self, user: str, code_hash: str, now_ms: int) -> bool:
        self._up()
        found = next((f for f in self._factors.values() if f.user == user and f.kind == RECOVERY), None)
        if found is None or code_hash not in found.code_hashes:
            return False
        left = tuple(h for h in found.code_hashes if h != code_hash)
        self._factors[found.factor_id] = replace(found, code_hashes=left, last_used_ts=now_ms)
        return True

    async def add_challenge(self, challenge: Challenge) -> None:
        self._up()
        self._challenges[challenge.key] = challenge

    async def take_challenge(self, key: str) -> Challenge | None:
        self._up()
        found = self._challenges.pop(key, None)
        if found is None or found.expires_ts <= self.clock() * 1000:
            return None
        return found
