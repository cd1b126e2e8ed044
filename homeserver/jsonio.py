"""JSON in and out: compact UTF-8 responses, strict request bodies."""

from __future__ import annotations

import json
from typing import Any

from homeserver.errors import M_BAD_JSON, M_NOT_JSON, MatrixError

# json.dumps with these arguments builds a new encoder on every call; this one is made once.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# JSONEncoder.encode in turn makes a new C encoder for every value; this is that C encoder,
# made once with the same settings (json.encoder.c_make_encoder, json's own accelerator;
# None where the C module is missing). Without the circular-reference check: a response
# is built by this server, never from a structure that contains itself.
_C_ENCODER = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


def encode_json(value: Any) -> bytes:
    """Serialise compactly as UTF-8; the Content-Type is set once, exactly, by the handler."""
    if _C_ENCODER is not None and isinstance(value, dict):
        return "".join(_C_ENCODER(value, 0)).encode("utf-8")
    return _ENCODER.encode(value).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json_object(body: bytes) -> dict[str, Any]:
    """Parse a request body as a JSON object; M_NOT_JSON / M_BAD_JSON otherwise."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MatrixError(400, M_NOT_JSON, "Content not JSON.") from None
    if not isinstance(value, dict):
        raise MatrixError(400, M_BAD_JSON, "Content must be a JSON object.")
    return value
