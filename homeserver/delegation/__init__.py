"""This server as the authentication service of a Synapse (`[delegation]`, docs/delegation.md)."""

from homeserver.delegation.service import Delegation
from homeserver.delegation.settings import DelegationSettings, load_delegation_settings
from homeserver.delegation.synapse import (
    SynapseBadName,
    SynapseClient,
    SynapseError,
    SynapseMisconfigured,
    SynapseNotFound,
    SynapseRefused,
    SynapseUnreachable,
)

__all__ = [
    "Delegation",
    "DelegationSettings",
    "SynapseBadName",
    "SynapseClient",
    "SynapseError",
    "SynapseMisconfigured",
    "SynapseNotFound",
    "SynapseRefused",
    "SynapseUnreachable",
    "load_delegation_settings",
]
