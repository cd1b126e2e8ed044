"""The static response bodies (well-knowns, versions, login flows, capabilities), serialised once."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.config import Config
from homeserver.jsonio import encode_json

ROOM_VERSIONS = {str(v): "stable" for v in range(1, 12)}


@dataclass(frozen=True)
class Documents:
    """The static response bodies, serialised once at start-up."""

    well_known_client: bytes
    well_known_support: bytes
    versions: bytes
    login_flows: bytes
    capabilities: bytes

    @classmethod
    def from_config(cls, config: Config) -> Documents:
        server = config.section("server")
        support = config.section("support")
        base_url = server["base_url"].rstrip("/")
        client = {"m.homeserver": {"base_url": server["base_url"]}}
        if server["identity_server_url"]:
            client["m.identity_server"] = {"base_url": server["identity_server_url"]}
        disabled = {"enabled": False}  # the service changes no account
        return cls(
            well_known_client=encode_json(client),
            well_known_support=encode_json(
                {
                    "contacts": [
                        {
                            "email_address": support["email_address"],
                            "matrix_id": support["matrix_id"],
                            "role": support["role"],
                        }
                    ],
                    "support_page": base_url + "/support.html",
                }
            ),
            versions=encode_json({"versions": ["v1.12"]}),
            login_flows=encode_json({"flows": [{"type": "m.login.password"}]}),
            capabilities=encode_json(
                {
                    "capabilities": {
                        "m.change_password": disabled,
                        "m.set_displayname": disabled,
                        "m.set_avatar_url": disabled,
                        "m.3pid_changes": disabled,
                        "m.get_login_token": disabled,
                        "m.room_versions": {"default": "10", "available": ROOM_VERSIONS},
                    }
                }
            ),
        )
