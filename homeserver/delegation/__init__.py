"""This server as the authentication service of a Synapse (`[delegation]`, docs/delegation.md)."""

from homeserver.delegation.service import Delegation, new_device_id
from homeserver.delegation.settings import DelegationSettings, load_delegation_settings
from homeserver.delegation.synapse import (
    SynapseClient,
    SynapseError,
    SynapseNotFound,
    SynapseRefused,
    SynapseUnreachable,
)

__all__ = [
    "Delegation",
    "DelegationSettings",
    "SynapseClient",
    "SynapseError",
    "SynapseNotFound",
    "SynapseRefused",
    "SynapseUnreachable",
    "load_delegation_settings",
    "new_device_id",
]
