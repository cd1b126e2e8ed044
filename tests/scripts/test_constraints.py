"""The lock files scripts/lock.sh writes cover every requirement, within its range.

constraints.txt pins (with hashes) all that requirements.txt needs, for the README's install;
constraints-migrate.txt what requirements-migrate.txt adds (migrate-synapse's optional
PostgreSQL driver); constraints-dev.txt all that requirements-dev.txt needs, for
scripts/test.sh (CI). A name
added to a requirements file, or a range moved past its pin, fails here until
scripts/lock.sh is run again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def requirements(name: str) -> dict[str, Requirement]:
    """A requirements file's requirements by canonical name, `-r` files included."""
    found: dict[str, Requirement] = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found.update(requirements(line[3:].strip()))
        elif line:
            assert not line.startswith("-"), f"{name}: an option scripts/lock.sh does not expect: {line}"
            requirement = Requirement(line)
            found[canonicalize_name(requirement.name)] = requirement
    return found


def pins(name: str) -> dict[str, tuple[Requirement, list[str]]]:
    """A lock file's pins by canonical name: the requirement and its hashes."""
    text = re.sub(r"\\\n", " ", (ROOT / name).read_text())
    found: dict[str, tuple[Requirement, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement_text, *options = line.split(" --")
        options = [option.strip() for option in options]
        hashes = [option.removeprefix("hash=") for option in options if option.startswith("hash=")]
        assert len(hashes) == len(options), f"{name}: {line}"
        requirement = Requirement(requirement_text.strip())
        found[canonicalize_name(requirement.name)] = (requirement, hashes)
    return found


@pytest.mark.parametrize(("lock", "wanted"), [("constraints.txt", ["requirements.txt"]),
                                              ("constraints-migrate.txt", ["requirements-migrate.txt"]),
                                              ("constraints-dev.txt", ["requirements.txt", "requirements-dev.txt"])])
def test_every_requirement_is_pinned_within_its_range_with_hashes(lock, wanted):
    pinned = pins(lock)
    assert pinned, lock
    for name, (requirement, hashes) in pinned.items():
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"{lock}: {requirement} is not one release"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{lock}: {name}"
    for file in wanted:
        for name, requirement in requirements(file).items():
            assert name in pinned, f"{file} asks for {requirement}, {lock} does not pin it: run scripts/lock.sh"
            version = next(iter(pinned[name][0].specifier)).version
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{lock} pins {name}=={version}, outside {file}'s {requirement}: run scripts/lock.sh"
            )
            assert pinned[name][0].marker == requirement.marker, f"{lock}: {name} lost its marker"


@pytest.mark.parametrize("lock", ["constraints.txt", "constraints-migrate.txt"])
def test_the_server_and_the_tests_install_the_same_releases(lock):
    server, dev = pins(lock), pins("constraints-dev.txt")
    assert set(server) <= set(dev)
    for name, (requirement, hashes) in server.items():
        assert str(dev[name][0].specifier) == str(requirement.specifier), name
        assert set(dev[name][1]) == set(hashes), name


def test_the_migration_driver_is_not_the_servers():
    """psycopg is migrate-synapse's optional install: the server's lock does not carry it."""
    assert "psycopg" in pins("constraints-migrate.txt")
    assert "psycopg" not in pins("constraints.txt")


def test_the_installs_use_the_locks():
    readme = (ROOT / "README.md").read_text()
    assert "pip install --require-hashes -r constraints.txt" in readme
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "--require-hashes -r constraints-dev.txt" in script
    assert "constraints*.txt" in script  # a changed lock reinstalls
