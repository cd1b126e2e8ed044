"""Deleting devices: User-Interactive Auth first, then every session of those devices ends."""

from __future__ import annotations

import json
from typing import Any

from homeserver.auth import Requester
from homeserver.errors import invalid_param, missing_param
from homeserver.sessions import DEVICE_DELETED, Sessions
from homeserver.uia import UserInteractiveAuth

# More device IDs than anyone has, in one request, is a mistake or an attack.
MAX_DEVICES = 1000


def device_list(body: dict[str, Any]) -> list[str]:
    """The `devices` of POST /delete_devices: a list of strings."""
    devices = body.get("devices")
    if devices is None:
        raise missing_param("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise invalid_param("devices", "a list of strings")
    if len(devices) > MAX_DEVICES:
        raise invalid_param("devices", f"a list of at most {MAX_DEVICES} device IDs")
    return devices


async def delete_devices(
    sessions: Sessions, uia: UserInteractiveAuth, requester: Requester, body: dict[str, Any], device_ids: list[str]
) -> None:
    """End every session of these devices of the requester, once UIA is passed.

    Devices that do not exist (or were deleted before) are no error, as v1.12 says.
    """
    operation = "delete_devices " + json.dumps(sorted(set(device_ids)))
    await uia.check(requester, body, operation)
    if device_ids:
        await sessions.end_devices(requester.user.name, device_ids, DEVICE_DELETED)
