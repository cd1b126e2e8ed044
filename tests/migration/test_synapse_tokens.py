"""Synapse's `syt_` tokens read as Synapse makes them (its own code, run here on made-up localparts)."""

from __future__ import annotations

import random
import string
import zlib

import pytest

from homeserver.synapse_tokens import base62, maybe_legacy, synapse_token_user


def synapse_made(localpart: str) -> str:
    """What Synapse 1.163's generate_access_token returns (unpaddedbase64, random_string, base62)."""
    import base64

    b64local = base64.b64encode(localpart.encode("utf-8")).decode("ascii").rstrip("=")
    random_string = "".join(random.choice(string.ascii_letters) for _ in range(20))
    base = f"syt_{b64local}_{random_string}"
    return f"{base}_{base62(zlib.crc32(base.encode('ascii')))}"


@pytest.mark.parametrize("localpart", ["alice", "a", "_bridge_bot", "é-ü.x=y/z", "user+tag", "x" * 255])
def test_the_localpart_of_a_token_synapse_made(localpart):
    assert synapse_token_user(synapse_made(localpart)) == localpart


def test_base62_matches_synapses():
    # synapse.util.stringutils.base62_encode(0, minwidth=6) == "000000"; 61 -> "z"; 62 -> "10".
    assert (base62(0), base62(61), base62(62), base62(2**32 - 1)) == ("000000", "00000z", "000010", "4gfFC3")


def test_a_broken_token_names_nobody():
    good = synapse_made("alice")
    base, _, crc = good.rpartition("_")
    broken = [
        base + "_" + ("A" if crc[0] != "A" else "B") + crc[1:],  # the CRC does not hold
        good.replace("syt_", "syr_"),  # a refresh token is no access token
        good[:-1],
        "syt_",
        "syt___x",
        good + "é",
        "syt_" + "A" * 600,
    ]
    assert [synapse_token_user(t) for t in broken] == [None] * len(broken)


def test_which_tokens_are_looked_up_by_digest():
    macaroon = "MDAxN2xvY2F0aW9uIGxvY2FsaG9zdAowMDEzaWRlbnRpZmllciBrZXkKMDAxMGNpZCBnZW4gPSAx"
    assert maybe_legacy(macaroon)
    assert not maybe_legacy("a.b.c") and not maybe_legacy("") and not maybe_legacy("x" * 5000)
