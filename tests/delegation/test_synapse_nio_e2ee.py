"""End-to-end encryption with a second client library: two matrix-nio clients with libolm
(Debian's python3-olm, tests/support/nio_e2e.py) talk encrypted through nginx, this server (logins)
and the real Synapse (tests/support/delegation_stack.py), as the js-sdk clients of
tests/delegation/test_synapse_clients.py do with their Rust crypto."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.delegation.test_synapse_account_state import add_user
from tests.support.delegation_stack import ROOT, DelegationStack
from tests.support.helpers import ci
from tests.support.nio_e2e import NioUnavailable, nio_python

SENDER, RECEIVER = "nio-e2ee-sender", "nio-e2ee-receiver"


@pytest.fixture(scope="session")
def nio_e2e() -> Path:
    """The Python of the matrix-nio[e2e] virtualenv; skipped with the reason when it cannot
    be had, failed for it when CI is set."""
    try:
        return nio_python()
    except NioUnavailable as exc:
        if ci():
            pytest.fail(f"{exc} (CI is set: the matrix-nio encryption test must run)")
        pytest.skip(str(exc))


def test_end_to_end_encryption_with_matrix_nio_and_libolm(synapse_stack: DelegationStack, nio_e2e: Path,
                                                          tmp_path: Path) -> None:
    stack = synapse_stack
    for name in (SENDER, RECEIVER):
        add_user(stack, name, f"{name}-password")
    script = os.path.join(ROOT, "tests", "nio", "e2ee_chat.py")
    done = subprocess.run(
        [str(nio_e2e), script, stack.url, SENDER, f"{SENDER}-password", RECEIVER, f"{RECEIVER}-password",
         str(tmp_path / "stores")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["encrypted_room"] is True
    # Each login here is a device of its own, whose keys nio uploaded to Synapse.
    first_device, second_device = out["devices"]
    assert first_device != second_device
    # Sent encrypted, decrypted by the other side, both ways.
    assert out["first"] == {"body": "first secret", "sender": f"@{SENDER}:localhost", "decrypted": True}
    assert out["reply"] == {"body": "and back", "sender": f"@{RECEIVER}:localhost", "decrypted": True}
    # Synapse holds ciphertext only.
    assert out["wire_types"] == ["m.room.encrypted"] and out["messages_on_the_wire"] == 2
    assert out["plaintext_on_server"] is False
