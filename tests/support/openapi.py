"""Validate responses against the Matrix v1.12 OpenAPI files carried in tests/matrix-spec."""

from __future__ import annotations

import functools
import os
from typing import Any

import jsonschema
import yaml

from tests.support.helpers import Response

# Unmodified copies of matrix-org/matrix-spec's data files at tag v1.12 (Apache-2.0; see
# tests/matrix-spec/NOTICE), in the repository so a clone anywhere runs these checks.
SPEC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "matrix-spec", "data", "api", "client-server")


@functools.cache
def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _pointer(doc: Any, pointer: str) -> Any:
    for part in filter(None, pointer.split("/")):
        doc = doc[part.replace("~1", "/").replace("~0", "~")]
    return doc


def _inline(node: Any, path: str) -> Any:
    """Replace every $ref (other file or same file) by its target, recursively."""
    if isinstance(node, dict):
        if "$ref" in node:
            target, _, pointer = node["$ref"].partition("#")
            file = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            return _inline(_pointer(_load(file), pointer), file)
        return {key: _inline(value, path) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, path) for item in node]
    return node


def schema_for(spec_file: str, path: str, method: str, status: int) -> dict[str, Any]:
    file = os.path.join(SPEC_DIR, spec_file)
    operation = _load(file)["paths"][path][method.lower()]
    response = operation["responses"][str(status)]
    return _inline(response["content"]["application/json"]["schema"], file)


def validate(resp: Response, spec_file: str, path: str, method: str = "GET") -> None:
    """Check the response body against the documented schema for its status."""
    schema = schema_for(spec_file, path, method, resp.status)
    jsonschema.validate(resp.json, schema)


def validate_error(resp: Response) -> None:
    """Check an error body against v1.12's error definition (for a status an endpoint's file
    does not list, such as the 401 M_USER_LOCKED of a login)."""
    file = os.path.join(SPEC_DIR, "definitions", "errors", "error.yaml")
    jsonschema.validate(resp.json, _inline(_load(file), file))
