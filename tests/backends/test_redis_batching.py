"""Lookups asked for in one event-loop turn go to Redis as one pipeline; each gets its own answer."""

from __future__ import annotations

import asyncio

import pytest

from homeserver.errors import StoreDataError
from tests.support.helpers import record
from tests.support.redis_servers import redis_overrides


@pytest.fixture
def config_overrides(redis_users):
    return redis_overrides(redis_users)


def count_pipelines(monkeypatch, backend) -> list[int]:
    """Record the size of every pipeline the backend sends."""
    sizes: list[int] = []
    client = backend.client
    real_pipeline = client.pipeline

    def pipeline(*args, **kwargs):
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        async def execute(*a, **k):
            sizes.append(len(pipe.command_stack))
            return await real_execute(*a, **k)

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)
    return sizes


async def test_concurrent_lookups_share_a_pipeline_and_get_their_own_user(redis_users, backend, monkeypatch):
    names = [f"user{i}" for i in range(20)]
    for name in names:
        redis_users.put_record(record(name, ident=f"-{name}"))
    sizes = count_pipelines(monkeypatch, backend)
    users = await asyncio.gather(*(backend.get_user(n) for n in [*names, "nobody"]))
    assert [u.name for u in users[:-1]] == names
    assert [u.ident for u in users[:-1]] == [f"-{n}" for n in names]
    assert users[-1] is None
    assert sizes and sum(sizes) == 21 and max(sizes) > 1


async def test_a_bad_key_fails_only_its_own_lookup(redis_users, backend):
    redis_users.put_record(record("good"))
    redis_users.client.set(redis_users.prefix + "broken", "a string")
    good, broken = await asyncio.gather(
        backend.get_user("good"), backend.get_user("broken"), return_exceptions=True
    )
    assert good.name == "good"
    assert isinstance(broken, StoreDataError) and "is not a hash" in str(broken)


async def test_a_lone_lookup_is_a_plain_command(redis_users, backend, monkeypatch):
    sizes = count_pipelines(monkeypatch, backend)
    assert (await backend.get_user("alice")).name == "alice"
    assert sizes == []


async def test_a_deleted_user_is_gone_for_the_next_lookup(redis_users, backend):
    assert (await backend.get_user("alice")) is not None
    redis_users.client.delete(redis_users.prefix + "alice")
    assert (await backend.get_user("alice")) is None
