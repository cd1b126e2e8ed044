"""Synapse's password hashes checked here exactly as Synapse checks them
(homeserver/synapse_passwords.py), against hashes made by Synapse's own code.

The pinned Synapse's `AuthHandler.hash` and `validate_hash` (synapse/handlers/auth.py) run
in Synapse's virtualenv, on the real functions, with only its thread hop made synchronous;
and its `hash_password` script, the operators' tool. Every candidate password gets the same
answer here as from Synapse's validate_hash on the same hash.
"""

from __future__ import annotations

import json
import subprocess
import unicodedata

import pytest

from homeserver.passwords import HashDecodeError
from homeserver.synapse_passwords import check_synapse_password, synapse_password_bytes
from tests.migration.conftest import unavailable
from tests.support.synapse import SynapseUnavailable, synapse_python

PEPPER = "pepper-from-homeserver.yaml"
LONG = "x" * 71  # with the pepper past 72 bytes: only the pepper's first byte counts

# (password hashed, pepper, candidates tried against that hash)
CASES: list[tuple[str, str, list[str]]] = [
    ("correct horse", "", ["correct horse", "correct horse ", "Correct horse", ""]),
    ("correct horse", PEPPER, ["correct horse", "correct horse" + PEPPER, "wrong"]),
    # NFKC: the ligature ﬁ is "fi", full-width letters are ASCII, e + combining acute is é.
    ("ﬁsh ＡＢＣ café", PEPPER, ["fish ABC café", "ﬁsh ＡＢＣ cafe\u0301", "fish ABC cafe", "ﬁsh ＡＢＣ café"]),
    ("fish ABC café", PEPPER, ["ﬁsh ＡＢＣ café", "fish abc café"]),
    ("Ⅻ ㍿ ½", "", ["XII 株式会社 1⁄2", "Ⅻ ㍿ ½", "XII"]),
    # 72 bytes: the pepper pushed out in part or whole; what comes after never counts.
    (LONG, PEPPER, [LONG, LONG + "y", "x" * 72, "x" * 70]),
    ("y" * 72, PEPPER, ["y" * 72 + "anything", "y" * 72, "y" * 71]),
    ("€" * 30, "", ["€" * 24, "€" * 24 + "x", "€" * 23]),
    # A multi-byte character cut at byte 72.
    ("a" * 71 + "€", "", ["a" * 71 + "\u20ad", "a" * 71 + "x", "a" * 71]),
    ("p\u00e4ss", "\u00fc", ["pa\u0308ss", "päss"]),
]

SCRIPT = r"""
import json, sys
from types import SimpleNamespace
from twisted.internet import defer
import synapse.handlers.auth as auth

# Synapse runs the hash on its thread pool; here on the spot, the functions themselves unchanged.
auth.defer_to_thread = lambda reactor, f, *args, **kwargs: defer.maybeDeferred(f, *args, **kwargs)

def run(coroutine):
    out = []
    defer.ensureDeferred(coroutine).addBoth(out.append)
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]

answers = []
for password, pepper, candidates in json.load(sys.stdin):
    handler = object.__new__(auth.AuthHandler)
    handler.hs = SimpleNamespace(config=SimpleNamespace(auth=SimpleNamespace(password_pepper=pepper)),
                                 get_reactor=lambda: None)
    handler.bcrypt_rounds = 4
    hashed = run(handler.hash(password))
    answers.append({"hash": hashed, "valid": [run(handler.validate_hash(c, hashed)) for c in candidates]})
# A password holding a lone surrogate: Synapse cannot hash it.
handler.hs.config.auth.password_pepper = ""
try:
    run(handler.hash("\ud800"))
    answers.append("hashed")
except UnicodeEncodeError:
    answers.append("UnicodeEncodeError")
json.dump(answers, sys.stdout)
"""


@pytest.fixture(scope="module")
def synapse_auth_code():
    """The hashes and verdicts of Synapse's own AuthHandler for CASES, and its answer to a
    lone surrogate."""
    try:
        python = synapse_python()
    except SynapseUnavailable as exc:
        unavailable(exc)
    done = subprocess.run([str(python), "-c", SCRIPT], input=json.dumps(CASES), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_every_candidate_gets_synapses_own_answer(synapse_auth_code, index):
    password, pepper, candidates = CASES[index]
    answer = synapse_auth_code[index]
    assert answer["hash"].startswith("$2b$04$")
    ours = [check_synapse_password(candidate, answer["hash"], pepper) for candidate in candidates]
    assert ours == answer["valid"]
    assert ours[0] or password != candidates[0]  # the password itself always matches
    assert check_synapse_password(password, answer["hash"].encode(), pepper)
    # Without Synapse's pepper, never; unless the password alone fills bcrypt's 72 bytes,
    # which cuts the pepper off wholly (Synapse's hash of it never held the pepper).
    wholly_cut = len(unicodedata.normalize("NFKC", password).encode()) >= 72
    assert check_synapse_password(password, answer["hash"], "") is (not pepper or wholly_cut)


def test_the_cases_cover_normalisation_and_the_72_byte_cut(synapse_auth_code):
    """The table is no tautology: NFKC changes passwords, and the cut drops pepper bytes."""
    verdicts = {(CASES[i][0], c): v for i, answer in enumerate(synapse_auth_code[:-1])
                for c, v in zip(CASES[i][2], answer["valid"], strict=True)}
    assert unicodedata.normalize("NFKC", "ﬁsh ＡＢＣ café") != "ﬁsh ＡＢＣ café"
    assert verdicts[("ﬁsh ＡＢＣ café", "fish ABC café")] is True
    assert verdicts[("fish ABC café", "fish abc café")] is False
    assert verdicts[(LONG, LONG + "y")] is False and verdicts[(LONG, "x" * 72)] is False
    assert verdicts[("y" * 72, "y" * 72 + "anything")] is True
    assert len(synapse_password_bytes(LONG, PEPPER) or b"") == 72


def test_a_lone_surrogate_matches_no_synapse_hash(synapse_auth_code):
    assert synapse_auth_code[-1] == "UnicodeEncodeError"  # Synapse could not hash it
    assert synapse_password_bytes("\ud800") is None
    assert check_synapse_password("\ud800", synapse_auth_code[0]["hash"]) is False


def test_synapses_hash_password_script_makes_hashes_that_match(tmp_path):
    """The operators' tool (synapse/_scripts/hash_password.py) reads pepper and rounds from
    the config file, as an operator resetting a password would."""
    try:
        python = synapse_python()
    except SynapseUnavailable as exc:
        unavailable(exc)
    config = tmp_path / "homeserver.yaml"
    config.write_text(json.dumps({"bcrypt_rounds": 4, "password_config": {"pepper": PEPPER}}))
    done = subprocess.run([str(python), "-m", "synapse._scripts.hash_password", "-c", str(config), "-p", "ﬁne Ｐassword"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip().splitlines()[-1]
    assert hashed.startswith("$2b$04$")
    assert check_synapse_password("fine Password", hashed, PEPPER)
    assert not check_synapse_password("fine Password", hashed)


@pytest.mark.parametrize("stored", ["", b""])
def test_an_empty_hash_matches_nothing(stored):
    assert check_synapse_password("", stored) is False


@pytest.mark.parametrize("stored", ["not a hash", "$2b$04$short", "$2b$04$" + "é" * 53])
def test_a_hash_bcrypt_cannot_read_is_a_decode_error(stored):
    with pytest.raises(HashDecodeError):
        check_synapse_password("pw", stored)
