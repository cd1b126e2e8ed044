"""Matrix error codes are named once, in homeserver/errors.py, and used by name everywhere."""

from __future__ import annotations

import re
from pathlib import Path

from homeserver import errors

ROOT = Path(__file__).resolve().parent.parent
LITERAL = re.compile(r"""["'](M_[A-Z_]+)["']""")


def test_every_error_code_is_a_constant_named_as_it_reads():
    codes = [name for name in errors.__all__ if name.startswith("M_")]
    assert codes and all(getattr(errors, name) == name for name in codes)


def test_no_error_code_is_spelt_out_outside_errors_py():
    spelt = [
        f"{path.relative_to(ROOT)}:{number}: {match}"
        for folder in ("homeserver", "backends")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "homeserver" / "errors.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in LITERAL.findall(line)
    ]
    assert spelt == []
