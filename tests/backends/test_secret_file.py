"""The one secret-file reader: the signing secret, the delegation secret and the LDAP bind
password read alike, a file group or others may read is a warning naming it, a bad one a
one-line error."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from backends import secret_file
from backends.secret_file import read_secret_file
from homeserver.config import build_config
from homeserver.context import create_backend
from homeserver.delegation import load_delegation_settings
from homeserver.errors import ConfigError
from homeserver.tokens import load_secret

SECRET = "s" * 40


def secret_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "backends.secret_file" and r.levelno == logging.WARNING]


def write(path: Path, text: str, mode: int) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def auth_secret(tmp_path: Path) -> str:
    config = build_config({"auth": {"secret_file": "kept.secret"}}, path=str(tmp_path / "hs.toml"), environ={})
    return load_secret(config)


def delegation_secret(tmp_path: Path) -> str:
    section = {"enabled": True, "synapse_url": "http://127.0.0.1:1", "secret_file": "shared.secret"}
    config = build_config({"delegation": section}, path=str(tmp_path / "hs.toml"), environ={})
    settings = load_delegation_settings(config)
    assert settings is not None
    return settings.secret


def ldap_password(tmp_path: Path) -> str:
    ldap = {"uri": "ldap://127.0.0.1:1", "base": "dc=example,dc=org", "bind_dn": "cn=reader,dc=example,dc=org",
            "bind_password_file": "bind.pw"}
    config = build_config(
        {"backend": {"type": "ldap", "ldap": ldap}}, path=str(tmp_path / "hs.toml"), environ={}
    )
    return create_backend(config).settings.bind_password  # type: ignore[attr-defined]


READERS = [
    ("auth.secret_file", "kept.secret", auth_secret),
    ("delegation.secret_file", "shared.secret", delegation_secret),
    ("backend.ldap.bind_password_file", "bind.pw", ldap_password),
]


@pytest.mark.parametrize("key, file, read", READERS, ids=[r[0] for r in READERS])
@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640])
def test_a_secret_file_others_may_read_is_a_warning_naming_it(tmp_path, caplog, key, file, read, mode):
    path = write(tmp_path / file, SECRET + "\n", mode)
    with caplog.at_level(logging.WARNING):
        assert read(tmp_path) == SECRET
        read(tmp_path)  # read again (the server and each worker read it): named once
    assert secret_warnings(caplog) == [f"{key} {path} can be accessed by group or others (mode {mode:04o}); chmod 600 it"]


@pytest.mark.parametrize("key, file, read", READERS, ids=[r[0] for r in READERS])
def test_a_private_secret_file_is_read_quietly(tmp_path, caplog, key, file, read):
    write(tmp_path / file, SECRET + "\n", 0o600)
    with caplog.at_level(logging.WARNING):
        assert read(tmp_path) == SECRET
    assert secret_warnings(caplog) == []


@pytest.mark.parametrize("key, file, read", READERS, ids=[r[0] for r in READERS])
def test_a_secret_file_that_is_not_text_is_one_line(tmp_path, key, file, read):
    path = tmp_path / file
    path.write_bytes(b"\xff\xfe" + b"x" * 40)
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as info:
        read(tmp_path)
    assert str(info.value) == f"{key}: {path} is not UTF-8 text"


@pytest.mark.parametrize("key, file, read", READERS, ids=[r[0] for r in READERS])
def test_an_unreadable_secret_file_is_one_line(tmp_path, key, file, read):
    path = tmp_path / file
    path.mkdir()  # a folder where the file should be: cannot be read, whoever runs the test
    with pytest.raises(ConfigError) as info:
        read(tmp_path)
    assert str(info.value) == f"{key}: {path} cannot be read (Is a directory)"


def test_the_generated_signing_secret_is_private_and_quiet(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        secret = auth_secret(tmp_path)
        assert auth_secret(tmp_path) == secret
    assert oct(os.stat(tmp_path / "kept.secret").st_mode & 0o777) == oct(0o600)
    assert secret_warnings(caplog) == []


def test_a_password_keeps_its_spaces_a_secret_does_not(tmp_path):
    path = write(tmp_path / "pw", "  pass word  \r\n", 0o600)
    assert read_secret_file("backend.ldap.bind_password_file", path, strip=False) == "  pass word  "
    assert read_secret_file("delegation.secret_file", path) == "pass word"
    with pytest.raises(ConfigError, match=r"^delegation\.secret_file: .*pw holds fewer than 32 bytes$"):
        read_secret_file("delegation.secret_file", path, min_bytes=32)


def test_warnings_held_during_start_up_come_out_when_released(tmp_path, caplog):
    path = write(tmp_path / "held.secret", SECRET, 0o644)
    secret_file.hold_warnings()
    try:
        with caplog.at_level(logging.WARNING):
            read_secret_file("delegation.secret_file", path)
            assert secret_warnings(caplog) == []  # a start-up that fails now says only its error
    finally:
        with caplog.at_level(logging.WARNING):
            secret_file.release_warnings()
    assert secret_warnings(caplog) == [
        f"delegation.secret_file {path} can be accessed by group or others (mode 0644); chmod 600 it"
    ]
    later = write(tmp_path / "later.secret", SECRET, 0o644)
    with caplog.at_level(logging.WARNING):
        read_secret_file("delegation.secret_file", later)  # released: at once
    assert len(secret_warnings(caplog)) == 2
