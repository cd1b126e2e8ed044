"""A real Synapse whose user directory searches every user (`user_directory: {enabled: true,
search_all_users: true}`, as docs/delegation.md's lifecycle asks), and this server (`run.py`)
as its authentication service on the user store a test chooses (the users file, Redis, a
slapd), started again on the same port for the next store. No nginx: what these tests look
at is what Synapse holds, through its client and admin APIs, called directly.

Synapse keeps its users from one store to the next, so each test names users of its own.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.delegation_stack import SECRET, SERVER_NAME, HomeserverProcess
from tests.support.helpers import hex_hash
from tests.support.synapse import Synapse, free_port, http

ADMIN = "admin"  # in every store, and in [delegation] admins: the admin API's caller
PASSWORD = "lifecycle-password"
SWEEP = "sync_interval = 0.5\ndeactivate_after = 0\n"


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def file_record(name: str, display_name: str) -> dict[str, Any]:
    return {"name": name, "password": hex_hash(PASSWORD), "ident": f" ({name})", "display_name": display_name}


class LifecycleStack:
    """One Synapse for the module; `serve` starts this server on a store (the one before stopped)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.hs_port = free_port()
        self.synapse = Synapse(
            folder / "synapse", SERVER_NAME, mas_endpoint=f"http://127.0.0.1:{self.hs_port}/", mas_secret=SECRET,
            extra={"user_directory": {"enabled": True, "search_all_users": True}},
        )
        self.synapse.start()
        self.homeserver: HomeserverProcess | None = None
        self._admin_token: str | None = None
        self._runs = 0

    def serve(self, store: str, users: list[dict[str, Any]] | None = None, delegation: str = SWEEP) -> HomeserverProcess:
        """This server on a new folder (its own session store) with `store` (TOML sections
        choosing the user store) appended; `users` for the users file."""
        self.stop_homeserver()
        self._runs += 1
        folder = self.folder / f"homeserver-{self._runs}"
        folder.mkdir()
        process = HomeserverProcess(folder, self.hs_port, self.synapse.url, self.synapse.url, store + "\n",
                                    delegation=delegation)
        if users is not None:
            (folder / "users.json").write_text(json.dumps({"users": users}))
        process.start()
        self.homeserver, self._admin_token = process, None
        return process

    def stop_homeserver(self) -> None:
        if self.homeserver is not None:
            self.homeserver.stop()
            self.homeserver = None

    def stop(self) -> None:
        self.stop_homeserver()
        self.synapse.stop()

    # -- as a client ---------------------------------------------------------------------

    def login(self, name: str, password: str = PASSWORD) -> dict[str, Any]:
        assert self.homeserver is not None
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": name}, "password": password}
        status, answer = http(self.homeserver.url + "/_matrix/client/v3/login", body)
        assert status == 200, (status, answer, self.homeserver.log())
        return dict(answer)

    def at_synapse(self, path: str, body: Any = None, token: str | None = None,
                   method: str | None = None) -> tuple[int, Any]:
        return http(self.synapse.url + path, body, token, method)

    def admin_token(self) -> str:
        if self._admin_token is None:
            self._admin_token = self.login(ADMIN)["access_token"]
        return self._admin_token

    def synapse_user(self, name: str) -> dict[str, Any] | None:
        """The user as Synapse's admin API has it; None when Synapse has no such user."""
        user_id = urllib.parse.quote(f"@{name}:{SERVER_NAME}")
        status, answer = self.at_synapse(f"/_synapse/admin/v2/users/{user_id}", token=self.admin_token())
        if status == 404:
            return None
        assert status == 200, (status, answer)
        return dict(answer)

    def deactivated(self, name: str) -> bool | None:
        user = self.synapse_user(name)
        return None if user is None else bool(user["deactivated"])

    def sweeps_logged(self, pattern: str) -> int:
        assert self.homeserver is not None
        return len(re.findall(pattern, self.homeserver.log_path.read_text(errors="replace")))
