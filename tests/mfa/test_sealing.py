"""Second-factor secrets at rest: AES-256-GCM under the operator's key, bound to their owner,
opened after a rotation by the previous keys; the key file made once, whole, mode 0600."""

from __future__ import annotations

import logging
import os
import stat
import threading

import pytest

from homeserver.config import build_config
from homeserver.errors import ConfigError
from homeserver.mfa.sealing import Keyring, SealError, associated_data, key_file_path, keyring, load_key

KEY = "k" * 32
OLD = "an old key of at least thirty-two bytes"
WHERE = associated_data("totp", "alice", "f1")


def test_a_sealed_secret_opens_with_its_owner_only():
    keys = Keyring(KEY)
    sealed = keys.seal(b"JBSWY3DPEHPK3PXP", WHERE)
    assert b"JBSWY3DPEHPK3PXP" not in sealed
    assert keys.open(sealed, WHERE) == b"JBSWY3DPEHPK3PXP"
    for other in (associated_data("totp", "bob", "f1"), associated_data("totp", "alice", "f2"),
                  associated_data("webauthn", "alice", "f1")):
        with pytest.raises(SealError):
            keys.open(sealed, other)


def test_each_seal_is_different():
    keys = Keyring(KEY)
    assert keys.seal(b"x", WHERE) != keys.seal(b"x", WHERE)


def test_a_tampered_value_does_not_open():
    keys = Keyring(KEY)
    sealed = bytearray(keys.seal(b"secret", WHERE))
    for index in (0, 1, 8, len(sealed) - 1):
        changed = bytearray(sealed)
        changed[index] ^= 1
        with pytest.raises(SealError):
            keys.open(bytes(changed), WHERE)
    for short in (b"", sealed[:5], sealed[:20]):
        with pytest.raises(SealError):
            keys.open(bytes(short), WHERE)


def test_another_key_does_not_open_it_and_says_nothing_of_the_secret():
    sealed = Keyring(OLD).seal(b"JBSWY3DPEHPK3PXP", WHERE)
    with pytest.raises(SealError) as caught:
        Keyring(KEY).open(sealed, WHERE)
    assert "JBSWY3DP" not in str(caught.value)


def test_after_a_rotation_the_previous_keys_open_and_the_new_key_seals():
    sealed = Keyring(OLD).seal(b"secret", WHERE)
    rotated = Keyring(KEY, [OLD])
    assert rotated.open(sealed, WHERE) == b"secret"
    assert not rotated.is_current(sealed)
    resealed = rotated.seal(b"secret", WHERE)
    assert rotated.is_current(resealed)
    assert Keyring(KEY).open(resealed, WHERE) == b"secret"


def test_digests_are_keyed_and_found_after_a_rotation():
    old = Keyring(OLD)
    rotated = Keyring(KEY, [OLD])
    assert old.digest(b"code") != Keyring(KEY).digest(b"code")
    assert rotated.digests(b"code") == [Keyring(KEY).digest(b"code"), old.digest(b"code")]
    assert rotated.digest(b"code") == Keyring(KEY).digest(b"code")


def test_a_short_key_is_refused():
    with pytest.raises(ValueError):
        Keyring("short")
    with pytest.raises(ValueError):
        Keyring(KEY, ["short"])


def test_the_config_keys():
    section = dict(build_config({}, environ={}).section("mfa"))
    # A file the server writes: taken from the state directory (homeserver.config.WRITTEN_FILES).
    key_file = section.pop("key_file")
    assert os.path.isabs(key_file) and os.path.basename(key_file) == "mfa.key"
    assert section == {
        "enabled": False, "required": "none", "key": "", "previous_keys": [],
        "issuer": "", "failed_codes_per_second": 0.017, "failed_codes_burst": 5,
    }
    with pytest.raises(ConfigError, match=r"mfa\.key"):
        build_config({"mfa": {"key": "short"}}, environ={})
    with pytest.raises(ConfigError, match=r"mfa\.previous_keys"):
        build_config({"mfa": {"previous_keys": ["short"]}}, environ={})
    with pytest.raises(ConfigError, match=r"mfa\.required"):
        build_config({"mfa": {"required": "some"}}, environ={})
    assert build_config({}, environ={"HOMESERVER_MFA__KEY": KEY}).get("mfa", "key") == KEY


def test_a_configured_key_is_used_and_no_file_made(tmp_path):
    config = build_config({"mfa": {"key": KEY}}, path=str(tmp_path / "homeserver.toml"), environ={})
    assert load_key(config) == KEY
    assert not os.path.exists(key_file_path(config))


def test_the_key_file_is_made_on_first_start_and_kept(tmp_path, caplog):
    config = build_config({}, path=str(tmp_path / "homeserver.toml"), environ={})
    path = key_file_path(config)
    assert path == str(tmp_path / "mfa.key")
    with caplog.at_level(logging.INFO):
        key = load_key(config)
    assert len(key) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert (tmp_path / "mfa.key").read_text() == key + "\n"
    assert load_key(config) == key
    assert key not in caplog.text and "mfa.key" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["mfa.key"]  # no temporary file left


def test_the_key_file_follows_the_state_directory(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    config = build_config({}, path=str(tmp_path / "homeserver.toml"), environ={"STATE_DIRECTORY": str(state)})
    assert key_file_path(config) == str(state / "mfa.key")


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    config = build_config({}, path=str(tmp_path / "homeserver.toml"), environ={})
    keys: list[str] = []
    start = threading.Barrier(8)

    def one() -> None:
        start.wait()
        keys.append(load_key(config))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys) == 8
    assert (tmp_path / "mfa.key").read_text() == keys[0] + "\n"


def test_a_key_file_that_cannot_be_made_is_one_line_naming_the_key(tmp_path):
    config = build_config({"mfa": {"key_file": str(tmp_path / "missing" / "mfa.key")}}, environ={})
    with pytest.raises(ConfigError, match=r"^mfa.key_file: cannot create .*missing/mfa.key"):
        load_key(config)


def test_a_short_key_file_is_refused(tmp_path):
    (tmp_path / "mfa.key").write_text("short\n")
    os.chmod(tmp_path / "mfa.key", 0o600)
    config = build_config({}, path=str(tmp_path / "homeserver.toml"), environ={})
    with pytest.raises(ConfigError, match=r"mfa\.key_file"):
        load_key(config)


def test_the_keyring_of_the_config_opens_what_the_previous_key_sealed(tmp_path):
    sealed = Keyring(OLD).seal(b"s", WHERE)
    config = build_config({"mfa": {"previous_keys": [OLD]}}, path=str(tmp_path / "homeserver.toml"), environ={})
    keys = keyring(config)
    assert keys.open(sealed, WHERE) == b"s"
    assert keys.is_current(keys.seal(b"s", WHERE)) and not keys.is_current(sealed)
