"""Through HTTP: a cached token loses its access as soon as its user is deleted."""

from __future__ import annotations

from tests.support.helpers import assert_json


async def test_deleted_user_token_rejected_within_cache_ttl(fetch, login, hs):
    token = (await login())["access_token"]
    assert_json(await fetch("/_matrix/client/v3/capabilities", token=token))  # now cached
    del hs.backend.users["alice"]
    resp = await fetch("/_matrix/client/v3/capabilities", token=token)
    assert resp.status == 401
    assert resp.json == {"errcode": "M_UNKNOWN_TOKEN", "error": "Unrecognised access token.", "soft_logout": False}


async def test_tampered_token_rejected_while_the_genuine_one_is_cached(fetch, login):
    token = (await login())["access_token"]
    assert_json(await fetch("/_matrix/client/v3/capabilities", token=token))
    head, _, sig = token.rpartition(".")
    bad = f"{head}.{sig[:-2]}{'A' if sig[-2] != 'A' else 'B'}{sig[-1]}"
    resp = await fetch("/_matrix/client/v3/capabilities", token=bad)
    assert resp.status == 401
    assert resp.json["errcode"] == "M_UNKNOWN_TOKEN"
