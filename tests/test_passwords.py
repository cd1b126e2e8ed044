"""Password bytes, the stored hex form and the bcrypt check."""

import bcrypt
import pytest

from homeserver.passwords import (
    HashDecodeError,
    check,
    hash_password,
    password_bytes,
)


def test_password_bytes_are_utf8_cut_to_72():
    assert password_bytes("a" * 100) == b"a" * 72
    assert password_bytes("€" * 25) == ("€" * 24).encode()
    assert password_bytes("\ud800") == b"\xed\xa0\x80"


def test_hash_password_is_hex_of_a_bcrypt_hash_at_the_cost():
    stored = hash_password("pw", rounds=4)
    hashed = bytes.fromhex(stored)
    assert hashed.startswith(b"$2b$04$")
    assert check("pw", hashed) and not check("px", hashed)
    assert check("x" * 72 + "ignored", bytes.fromhex(hash_password("x" * 80, rounds=4)))


def test_check_against_a_non_bcrypt_value_is_a_decode_error():
    with pytest.raises(HashDecodeError):
        check("pw", b"not a hash")
    with pytest.raises(HashDecodeError):
        check("pw", b"")
    assert check("pw", bcrypt.hashpw(b"pw", bcrypt.gensalt(4)))
