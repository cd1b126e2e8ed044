"""The delegation deployment of tests/support/delegation_stack.py (this server, a real Synapse, a real
nginx running conf/nginx-delegation.conf) with `[oauth]` on: Synapse proxies our metadata as
its `auth_metadata` and introspects the OAuth tokens; clients talk to nginx only."""

from __future__ import annotations

from pathlib import Path

from tests.support.delegation_stack import DelegationStack

# Long enough for Synapse's start-up chatter, short enough that a chat sees a refresh.
LIFETIME = 20


class OAuthStack(DelegationStack):
    """DelegationStack's parts in its order (ours, Synapse, nginx), OAuth on at ours."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, f"[oauth]\nenabled = true\naccess_token_lifetime = {LIFETIME}\n")
