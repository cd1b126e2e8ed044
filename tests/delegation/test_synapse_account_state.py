"""Account state under delegation with the real Synapse behind nginx (tests/support/delegation_stack.py):
a lock reaches Synapse (`provision_user`'s `locked`, seen in its admin API), and a display
name set at Synapse is put back by the next login here."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from typing import Any

from tests.support.delegation_stack import ROOT, SERVER_NAME, DelegationStack
from tests.support.synapse import http


def add_user(stack: DelegationStack, name: str, password: str) -> dict[str, Any]:
    """A user of this test's own, added to the stack's users file; its first login."""
    done = subprocess.run(
        [sys.executable, "run.py", "add-user", name, "--ident", f" [{name}]", "--display-name", name.title(),
         "--rounds", "4", "--config", str(stack.homeserver.config)],
        cwd=ROOT, input=password + "\n", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # The server sees the new record within a quarter of a second (backends.file.FRESHNESS).
    answers: list[tuple[int, Any]] = []
    until(lambda: answers.append(login(stack, name, password)) or answers[-1][0] != 403, "the new user seen")
    status, answer = answers[-1]
    assert status == 200, answer
    return dict(answer)


def login(stack: DelegationStack, name: str, password: str) -> tuple[int, Any]:
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": name}, "password": password}
    return stack.call("/_matrix/client/v3/login", body)


def at_synapse(stack: DelegationStack, name: str) -> dict[str, Any]:
    """The user as Synapse's admin API shows it."""
    user_id = urllib.parse.quote(f"@{name}:{SERVER_NAME}")
    status, answer = http(f"{stack.synapse.url}/_synapse/admin/v2/users/{user_id}", token=stack.admin_token())
    assert status == 200, (status, answer)
    return dict(answer)


def until(check, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_lock_and_an_unlock_reach_synapse(synapse_stack: DelegationStack) -> None:
    stack, name, password = synapse_stack, "lockable", "lockable-password"
    used = add_user(stack, name, password)["access_token"]
    assert stack.whoami(used)[0] == 200  # Synapse keeps this answer two minutes
    status, unused = login(stack, name, password)  # a token Synapse has not seen yet
    assert status == 200, unused
    assert at_synapse(stack, name)["locked"] is False
    assert stack.homeserver.run_py("lock", name).returncode == 0
    # The users file's reload names the account: Synapse is told at once.
    until(lambda: at_synapse(stack, name)["locked"] is True, "the lock at Synapse")
    # What clients see (README, "Account state"): Synapse's MAS mode has no answer for
    # "locked": a token it asks about now is unknown, for good; one it asked about before
    # works until its two-minute cache runs out.
    status, body = stack.whoami(unused["access_token"])
    assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False), body
    assert stack.whoami(used)[0] == 200
    status, refused = login(stack, name, password)
    assert (status, refused["errcode"]) == (401, "M_USER_LOCKED"), refused
    assert stack.homeserver.run_py("unlock", name).returncode == 0
    until(lambda: at_synapse(stack, name)["locked"] is False, "the unlock at Synapse")
    status, again = login(stack, name, password)
    assert status == 200 and stack.whoami(again["access_token"])[0] == 200, again


def test_a_name_set_at_synapse_is_put_back_by_the_next_login(synapse_stack: DelegationStack) -> None:
    stack, name, password = synapse_stack, "renamable", "renamable-password"
    answer = add_user(stack, name, password)
    user_id = f"@{name}:{SERVER_NAME}"
    profile = f"/_matrix/client/v3/profile/{urllib.parse.quote(user_id)}/displayname"
    assert stack.call(profile) == (200, {"displayname": "Renamable [renamable]"})
    # The user cannot rename herself at Synapse (enable_set_displayname: false) ...
    status, refused = stack.call(profile, {"displayname": "Queen of Hearts"}, answer["access_token"], "PUT")
    assert (status, refused["errcode"]) == (403, "M_FORBIDDEN"), refused
    # ... an admin can, and the next login here puts the store's name back.
    status, _ = http(f"{stack.synapse.url}/_synapse/admin/v2/users/{urllib.parse.quote(user_id)}",
                     {"displayname": "Queen of Hearts"}, stack.admin_token(), "PUT")
    assert status == 200
    assert stack.call(profile) == (200, {"displayname": "Queen of Hearts"})
    assert login(stack, name, password)[0] == 200
    assert stack.call(profile) == (200, {"displayname": "Renamable [renamable]"})
