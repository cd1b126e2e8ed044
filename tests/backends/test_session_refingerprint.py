"""`SessionStore.refingerprint`, the same for every store: what `run.py sessions adopt` writes."""

from __future__ import annotations

from tests.backends.test_session_store import each_session_store, session  # noqa: F401  (fixture)


async def test_refingerprint_counts_then_carries_only_the_sessions_end_stale_would_keep(each_session_store):  # noqa: F811
    store = each_session_store
    await store.open(session("k1", device="D1", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("k2", device="D2", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("old", device="D3", identity_fp="id-a", password_fp="pw-old"), None)  # a stale one
    await store.open(session("other", device="D4", identity_fp="id-z", password_fp="pw-a"), None)
    await store.open(session("legacy", device="D5"), None)  # opened before fingerprints
    await store.open(session("bob", user="bob", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("ended", device="D6", identity_fp="id-a", password_fp="pw-a"), None)
    await store.end("alice", "ended")
    # Counting writes nothing.
    assert await store.refingerprint("alice", ["id-a"], ["pw-a"], None) == 2
    assert (await store.get("alice", "k1")).identity_fp == "id-a"
    # Carrying: the two kept sessions get the new fingerprints, nothing else changes.
    assert await store.refingerprint("alice", ["id-a"], ["pw-a"], ("id-new", "pw-new")) == 2
    for token in ("k1", "k2"):
        got = await store.get("alice", token)
        assert (got.identity_fp, got.password_fp, got.ended_ts) == ("id-new", "pw-new", None)
    assert (await store.get("alice", "old")).identity_fp == "id-a"
    assert (await store.get("alice", "other")).identity_fp == "id-z"
    assert (await store.get("alice", "legacy")).identity_fp is None
    assert (await store.get("bob", "bob")).identity_fp == "id-a"
    assert (await store.get("alice", "ended")).identity_fp == "id-a"
    assert await store.refingerprint("alice", ["id-a"], ["pw-a"], None) == 0
    assert await store.refingerprint("alice", ["id-new"], ["pw-new"], None) == 2
    # Without password fingerprints (end_on_password_change = false) the identity decides.
    assert await store.refingerprint("alice", ["id-a"], None, ("id-b", "pw-b")) == 1
    assert (await store.get("alice", "old")).identity_fp == "id-b"
    # The carried sessions are kept by end_stale with the new fingerprints.
    assert sorted(await store.end_stale("alice", ["id-new"], ["pw-new"])) == ["D3", "D4"]
    assert {d.device_id for d in await store.devices("alice")} == {"D1", "D2", "D5"}
