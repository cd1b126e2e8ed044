"""Recovery codes: ten fresh, human-typeable codes, kept as keyed digests, read back from what
people type."""

from __future__ import annotations

import re

import pytest

from homeserver.mfa import recovery
from homeserver.mfa.sealing import Keyring

KEYS = Keyring("r" * 32)


def test_ten_distinct_codes_in_three_groups_of_four():
    codes = recovery.new_codes()
    assert len(codes) == 10 == len(set(codes))
    for code in codes:
        assert re.fullmatch(r"[0-9a-hjkmnp-tv-z]{4}-[0-9a-hjkmnp-tv-z]{4}-[0-9a-hjkmnp-tv-z]{4}", code), code


def test_codes_use_the_whole_alphabet():
    seen = set("".join(recovery.new_codes(200)).replace("-", ""))
    assert seen == set(recovery.ALPHABET)


@pytest.mark.parametrize("typed", [
    "7kq2-m9xd-a4fw", "7KQ2-M9XD-A4FW", "7kq2 m9xd a4fw", "7kq2m9xda4fw", " 7kq2\u2013m9xd\u2013a4fw\n",
    "7kq2_m9xd.a4fw",
])
def test_what_people_type_is_read_as_the_code(typed):
    assert recovery.normalize(typed) == "7kq2m9xda4fw"


def test_look_alike_letters_read_as_digits():
    assert recovery.normalize("0Ol1-iIab-cdef") == "001111abcdef"


@pytest.mark.parametrize("typed", ["", "123456", "7kq2-m9xd-a4f", "7kq2-m9xd-a4fwx", "7kq2-m9xd-a4fu", "x" * 500])
def test_what_cannot_be_a_code_is_none(typed):
    assert recovery.normalize(typed) is None
    assert recovery.candidate_digests(KEYS, "alice", typed) == []


def test_a_code_is_kept_as_a_keyed_digest_of_the_person_and_the_code():
    code = recovery.new_code()
    kept = recovery.digest(KEYS, "alice", code)
    assert code.replace("-", "") not in kept
    assert recovery.candidate_digests(KEYS, "alice", code.upper().replace("-", " ")) == [kept]
    assert kept not in recovery.candidate_digests(KEYS, "bob", code)
    assert kept not in recovery.candidate_digests(Keyring("s" * 32), "alice", code)


def test_a_code_kept_before_a_rotation_is_among_the_candidates():
    code = recovery.new_code()
    old = recovery.digest(KEYS, "alice", code)
    rotated = Keyring("s" * 32, ["r" * 32])
    assert recovery.candidate_digests(rotated, "alice", code)[1] == old


def test_digesting_something_else_is_an_error():
    with pytest.raises(ValueError):
        recovery.digest(KEYS, "alice", "not a code")
