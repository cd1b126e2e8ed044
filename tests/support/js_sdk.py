"""matrix-js-sdk from the npm registry, installed once into a cache inside .venv for the tests that drive it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.helpers import ci

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The current major release (it asks for Node >= 22; it runs on this machine's Node 20).
JS_SDK_MAJOR = 43


def install_js_sdk() -> tuple[str, str]:
    """(node, the cache folder holding node_modules/matrix-js-sdk); skipped with the reason
    when node, npm or the registry cannot be had, failed for it when CI is set."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        if ci():
            pytest.fail("node and npm are needed for the matrix-js-sdk tests")
        pytest.skip("node and npm are not installed")
    cache = os.path.join(ROOT, ".venv", "js", f"matrix-js-sdk-{JS_SDK_MAJOR}")
    if not os.path.isdir(os.path.join(cache, "node_modules", "matrix-js-sdk")):
        os.makedirs(cache, exist_ok=True)
        result = subprocess.run([npm, "install", "--silent", "--prefix", cache, f"matrix-js-sdk@{JS_SDK_MAJOR}"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            if ci():
                pytest.fail(f"npm install matrix-js-sdk failed: {result.stderr}")
            pytest.skip(f"npm install matrix-js-sdk failed: {result.stderr[-300:]}")
    return node, cache
