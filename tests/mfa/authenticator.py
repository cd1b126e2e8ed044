"""A software WebAuthn authenticator for tests without a browser: an EC P-256 key from
cryptography, attestation "none", and the answers a browser would send (PublicKeyCredential
as JSON, the shape of its toJSON()), each a field that a test may change to make it wrong."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

UP, UV, AT = 0x01, 0x04, 0x40


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class SoftAuthenticator:
    """One credential: made by `create`, used by `get`. `sign_count` grows by one a use unless
    `counts` is False (as synced passkeys, which report 0)."""

    origin: str
    rp_id: str
    counts: bool = True
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    credential_id: bytes = field(default_factory=lambda: os.urandom(16))
    sign_count: int = 0

    def cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps({
            "type": kind, "challenge": b64url(challenge), "origin": origin or self.origin, "crossOrigin": False,
        }).encode()

    def _auth_data(self, flags: int, rp_id: str | None, extra: bytes = b"") -> bytes:
        rp_hash = hashlib.sha256((rp_id or self.rp_id).encode()).digest()
        return rp_hash + bytes([flags]) + struct.pack(">I", self.sign_count) + extra

    def create(self, options: str | dict[str, Any], *, origin: str | None = None, rp_id: str | None = None,
               flags: int = UP | UV | AT) -> str:
        """The answer of navigator.credentials.create() to `options` (their JSON)."""
        opts = json.loads(options) if isinstance(options, str) else options
        attested = bytes(16) + struct.pack(">H", len(self.credential_id)) + self.credential_id + self.cose_key()
        auth_data = self._auth_data(flags, rp_id, attested)
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return json.dumps({
            "id": b64url(self.credential_id), "rawId": b64url(self.credential_id), "type": "public-key",
            "authenticatorAttachment": "platform", "clientExtensionResults": {},
            "response": {
                "clientDataJSON": b64url(self._client_data("webauthn.create", unb64url(opts["challenge"]), origin)),
                "attestationObject": b64url(attestation), "transports": ["internal"],
            },
        })

    def get(self, options: str | dict[str, Any], *, origin: str | None = None, rp_id: str | None = None,
            flags: int = UP | UV, credential_id: bytes | None = None) -> str:
        """The answer of navigator.credentials.get() to `options` (their JSON), signed."""
        opts = json.loads(options) if isinstance(options, str) else options
        if self.counts:
            self.sign_count += 1
        auth_data = self._auth_data(flags, rp_id)
        client_data = self._client_data("webauthn.get", unb64url(opts["challenge"]), origin)
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        cid = self.credential_id if credential_id is None else credential_id
        return json.dumps({
            "id": b64url(cid), "rawId": b64url(cid), "type": "public-key",
            "authenticatorAttachment": "platform", "clientExtensionResults": {},
            "response": {
                "clientDataJSON": b64url(client_data), "authenticatorData": b64url(auth_data),
                "signature": b64url(signature), "userHandle": None,
            },
        })
