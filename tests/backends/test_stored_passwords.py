"""The stored password's form (hex text of a bcrypt hash), checked by the file backend at start-up."""

from __future__ import annotations

import json

import bcrypt
import pytest

from backends.file import FileBackend
from backends.hashes import stored_password_problem
from homeserver.errors import ConfigError
from tests.support.helpers import record

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))


@pytest.mark.parametrize("prefix", [b"$2a$", b"$2b$", b"$2y$", b"$2x$"])
def test_hex_of_a_bcrypt_hash_is_usable(prefix):
    assert stored_password_problem((prefix + HASH[4:]).hex()) is None
    assert stored_password_problem((prefix + HASH[4:]).hex().upper()) is None


@pytest.mark.parametrize(
    "text, problem",
    [
        (HASH.decode(), "a bcrypt hash as plain text, not its hex text"),
        ("", "empty"),
        ("zz", "not hex text"),
        ("abc", "not hex text"),
        ("24 32", "not hex text"),
        ("ä", "not hex text"),
        (b"plain text".hex(), "hex text, but not of a bcrypt hash"),
        (HASH[:-1].hex(), "hex text, but not of a bcrypt hash"),  # bcrypt takes it, and never matches
        ((b"$2b$03$" + HASH[7:]).hex(), "hex text, but not of a bcrypt hash"),
        ((b"$2c$" + HASH[4:]).hex(), "hex text, but not of a bcrypt hash"),
        (b"\xff\xfe".hex(), "hex text, but not of a bcrypt hash"),
    ],
)
def test_unusable_stored_passwords_say_why(text, problem):
    assert problem in stored_password_problem(text)


@pytest.mark.parametrize(
    "password, problem",
    [(HASH.decode(), "a bcrypt hash as plain text"), (b"secret".hex(), "not of a bcrypt hash")],
)
async def test_the_file_backend_refuses_them_at_start_up_naming_the_record(tmp_path, password, problem):
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": [record("ann"), {**record("bob"), "password": password}]}))
    with pytest.raises(ConfigError) as caught:
        await FileBackend(str(path)).start()
    message = str(caught.value)
    assert f"users file {path}: record 1 ('bob'): field 'password' cannot be used: it is" in message
    assert problem in message and "\n" not in message
    # Told not to check, it loads them (their logins then answer 500, as Redis and LDAP do).
    backend = FileBackend(str(path), check_passwords=False)
    await backend.start()
    assert sorted(backend.users) == ["ann", "bob"]


@pytest.mark.parametrize("password", ["nothex", "zz-not-hex", ""])
async def test_text_that_is_not_hex_at_all_loads_so_rule_4_answers_it(tmp_path, password):
    # The specification's rule 4 (500 "Password hash decoding failed") must stay reachable
    # on the default set-up: only the two plain slips above stop start-up.
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": [record("ann"), {**record("bob"), "password": password}]}))
    backend = FileBackend(str(path))
    await backend.start()
    assert backend.users["bob"].password == password
