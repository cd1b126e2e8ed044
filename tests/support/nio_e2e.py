"""matrix-nio with its end-to-end encryption, for the tests: a virtualenv made from Debian's
python3 with `--system-site-packages`, so it finds Debian's `python3-olm` (libolm's Python
binding, which PyPI offers only as a source build), with `matrix-nio[e2e]` installed in it.

The virtualenv lives in `~/.cache/homeserver-tests/nio-e2e-<version>` (or under
`$HOMESERVER_TEST_CACHE`), made once (about 15 s) and reused, as tests/support/synapse.py's.
Only the standard library here.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

from tests.support.synapse import CACHE, INSTALLED_MARK

NIO_VERSION = "0.26.0"
# Debian's own Python: python3-olm is built for it only.
SYSTEM_PYTHON = "/usr/bin/python3"


class NioUnavailable(Exception):
    """matrix-nio with encryption cannot be had here: the reason."""


def nio_python() -> Path:
    """The Python of the cached virtualenv with matrix-nio[e2e], made (once, under a lock) when missing."""
    venv = CACHE / f"nio-e2e-{NIO_VERSION}"
    python = venv / "bin" / "python"
    if (venv / INSTALLED_MARK).exists():
        return python
    check = subprocess.run([SYSTEM_PYTHON, "-c", "import olm"], capture_output=True, text=True) if Path(
        SYSTEM_PYTHON).exists() else None
    if check is None or check.returncode != 0:
        raise NioUnavailable(
            f"Debian's python3-olm is not installed for {SYSTEM_PYTHON} (apt-get install python3-olm; "
            "scripts/install-test-services.sh does)"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"nio-e2e-{NIO_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be making it right now
        if (venv / INSTALLED_MARK).exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        steps = [
            [SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"matrix-nio[e2e]=={NIO_VERSION}"],
            [str(python), "-c", "from nio.crypto import ENCRYPTION_ENABLED; assert ENCRYPTION_ENABLED"],
        ]
        for step in steps:
            try:
                result = subprocess.run(step, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NioUnavailable(f"making the matrix-nio[e2e] virtualenv failed: {exc}") from None
            if result.returncode != 0:
                raise NioUnavailable(
                    f"making the matrix-nio[e2e] virtualenv failed ({' '.join(step[:3])}): {result.stderr.strip()[-500:]}"
                )
        (venv / INSTALLED_MARK).write_text(NIO_VERSION + "\n")
    return python
