"""The delegation deployment of tests/delegation_stack.py (this server, a real Synapse, a real
nginx running conf/nginx-delegation.conf) with `[oauth]` on: Synapse proxies our metadata as
its `auth_metadata` and introspects the OAuth tokens; clients talk to nginx only."""

from __future__ import annotations

from pathlib import Path

from tests.delegation_stack import SECRET, SERVER_NAME, DelegationStack, HomeserverProcess
from tests.nginx import Nginx
from tests.synapse import Synapse, free_port

# Long enough for Synapse's start-up chatter, short enough that a chat sees a refresh.
LIFETIME = 20


class OAuthStack(DelegationStack):
    """DelegationStack's parts in its order (ours, Synapse, nginx), OAuth on at ours."""

    def __init__(self, folder: Path) -> None:
        self.nginx_port, hs_port, synapse_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.nginx_port}"
        self.homeserver = HomeserverProcess(folder, hs_port, self.url, f"http://127.0.0.1:{synapse_port}")
        with open(self.homeserver.config, "a") as fh:
            fh.write(f"[oauth]\nenabled = true\naccess_token_lifetime = {LIFETIME}\n")
        self.synapse = Synapse(
            folder / "synapse", SERVER_NAME, port=synapse_port, public_baseurl=self.url + "/",
            mas_endpoint=f"http://127.0.0.1:{hs_port}/", mas_secret=SECRET,
        )
        self.nginx: Nginx | None = None
        self._admin_token: str | None = None
        try:
            self.homeserver.start()
            self.synapse.start()
            self.nginx = Nginx(folder / "nginx", self.nginx_port, hs_port, synapse_port)
        except BaseException:
            self.stop()
            raise
