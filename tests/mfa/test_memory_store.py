"""The store contract over the in-memory FactorStore the service's tests use."""

from __future__ import annotations

import pytest

from tests.mfa.memory_store import MemoryFactorStore
from tests.mfa.store_contract import FactorStoreContract, test_records_survive_their_text_form  # noqa: F401


class TestMemoryFactorStore(FactorStoreContract):
    @pytest.fixture
    def factor_store(self):
        return MemoryFactorStore()
