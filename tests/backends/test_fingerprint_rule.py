"""The credential-fingerprint rule, the same in every store and in both statements that apply it
(`end_stale` ends what it does not keep; `refingerprint`, `run.py sessions adopt`, counts and
carries what it keeps): a session opened without fingerprints is left alone; one with them is
kept while its identity digest is one of the accepted ones and, when passwords are compared,
its password digest is absent or one of those (one accepted digest per signing key)."""

from __future__ import annotations

import pytest

from tests.backends.test_session_store import each_session_store, session  # noqa: F401  (fixture)

UNMARKED, KEPT, STALE = "unmarked", "kept", "stale"

# (the session's identity and password fingerprints, accepted identity digests, accepted
# password digests (None: password changes are let pass), what the rule says)
CASES = {
    "no fingerprints kept": ((None, None), ["id-a"], ["pw-a"], UNMARKED),
    "no fingerprints kept, passwords not compared": ((None, None), ["id-a"], None, UNMARKED),
    "both match": (("id-a", "pw-a"), ["id-a"], ["pw-a"], KEPT),
    "identity changed": (("id-old", "pw-a"), ["id-a"], ["pw-a"], STALE),
    "password changed": (("id-a", "pw-old"), ["id-a"], ["pw-a"], STALE),
    "identity and password changed": (("id-old", "pw-old"), ["id-a"], ["pw-a"], STALE),
    "password changed, passwords not compared": (("id-a", "pw-old"), ["id-a"], None, KEPT),
    "identity changed, passwords not compared": (("id-old", "pw-a"), ["id-a"], None, STALE),
    "password fingerprints None: identity alone": (("id-a", "pw-a"), ["id-a"], None, KEPT),
    "no password fingerprint kept": (("id-a", None), ["id-a"], ["pw-a"], KEPT),
    "no password fingerprint kept, identity changed": (("id-old", None), ["id-a"], ["pw-a"], STALE),
    "several signing keys: the previous key's digests": (("id-b", "pw-b"), ["id-a", "id-b"], ["pw-a", "pw-b"], KEPT),
    "several signing keys: one digest of each key": (("id-a", "pw-b"), ["id-a", "id-b"], ["pw-a", "pw-b"], KEPT),
    "several signing keys: no identity matches": (("id-c", "pw-a"), ["id-a", "id-b"], ["pw-a", "pw-b"], STALE),
    "several signing keys: no password matches": (("id-b", "pw-c"), ["id-a", "id-b"], ["pw-a", "pw-b"], STALE),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_rule_is_one_in_both_statements(each_session_store, case):  # noqa: F811
    store = each_session_store
    (identity_fp, password_fp), identities, passwords, rule = CASES[case]
    await store.open(session("t", device="D1", identity_fp=identity_fp, password_fp=password_fp), None)
    await store.open(session("other", user="bob", device="D1", identity_fp="id-x", password_fp="pw-x"), None)

    # Counting writes nothing; carrying gives the new digests to what it counted, alone.
    assert await store.refingerprint("alice", identities, passwords, None) == (1 if rule == KEPT else 0)
    assert await store.refingerprint("alice", identities, passwords, ("id-new", "pw-new")) == (1 if rule == KEPT else 0)
    got = await store.get("alice", "t")
    carried = ("id-new", "pw-new") if rule == KEPT else (identity_fp, password_fp)
    assert (got.identity_fp, got.password_fp, got.ended_ts) == (*carried, None)

    # Against the carried digests, end_stale ends exactly what the rule did not keep.
    assert await store.end_stale("alice", ["id-new"], ["pw-new"]) == (["D1"] if rule == STALE else [])
    ended = (await store.get("alice", "t")).ended_ts is not None
    assert ended is (rule == STALE)
    assert (await store.get("bob", "other")).ended_ts is None  # another user's session: never touched


@pytest.mark.parametrize("case", list(CASES))
async def test_end_stale_ends_what_the_rule_does_not_keep(each_session_store, case):  # noqa: F811
    store = each_session_store
    (identity_fp, password_fp), identities, passwords, rule = CASES[case]
    await store.open(session("t", device="D1", identity_fp=identity_fp, password_fp=password_fp), None)
    assert await store.end_stale("alice", identities, passwords) == (["D1"] if rule == STALE else [])
    assert ((await store.get("alice", "t")).ended_ts is not None) is (rule == STALE)
    assert await store.refingerprint("alice", identities, passwords, None) == (1 if rule == KEPT else 0)
