"""Secret files (the token signing secret, the delegation secret, the LDAP bind password):
read in one place, with one error text and one warning for a file others can read.

It sits with the stores because the LDAP backend reads its bind password here and the
stores import nothing from above; the service modules import it from here.
"""

from __future__ import annotations

import logging
import os
import stat

from backends.base import ConfigError

logger = logging.getLogger(__name__)

# Group or others may do anything with it: a secret is for the service's own user.
EXPOSED = stat.S_IRWXG | stat.S_IRWXO
WARNING = "%s %s can be accessed by %s (mode %04o); chmod %s it"
# Warned of already in this process (worker processes inherit it from the parent, which
# reads the secrets before the fork): each file is named once, not once per process or read.
_warned: set[tuple[str, str, int]] = set()
# While the server starts, the warnings wait here (None: not holding) and are logged once
# it serves: a start-up that fails says its one error line and nothing else.
_held: list[tuple[str, str, str, int, str]] | None = None


def hold_warnings() -> None:
    """Keep the warnings back from now on, until `release_warnings()`."""
    global _held
    if _held is None:
        _held = []


def release_warnings() -> None:
    """Log the warnings held back (start-up succeeded), and log later ones at once."""
    global _held
    held, _held = _held, None
    for args in held or ():
        logger.warning(WARNING, *args)


class SecretFileMissing(ConfigError):
    """The secret file does not exist (the signing secret is then made and kept)."""


def warn_if_exposed(key: str, path: str, mode: int, exposed: int = EXPOSED) -> bool:
    """Log a warning naming `key` and `path` when `mode` grants any of the `exposed` bits
    (by default: any access by group or others); True if it does."""
    if not mode & exposed:
        return False
    if (key, path, mode) in _warned:
        return True
    _warned.add((key, path, mode))
    who, fix = ("group or others", "600") if exposed & stat.S_IRWXG else ("others", "o-rwx")
    args = (key, path, who, stat.S_IMODE(mode), fix)
    if _held is not None:
        _held.append(args)
    else:
        logger.warning(WARNING, *args)
    return True


def read_secret_file(key: str, path: str, *, min_bytes: int = 0, strip: bool = True) -> str:
    """The text of the secret file `path`, configured as `key` (named in every message).

    `strip`: surrounding white space is dropped (a generated secret or a shared token);
    otherwise only the line ending an editor adds is (a password may end in spaces).
    ConfigError, one line, for a file that cannot be read, is not UTF-8 or is shorter than
    `min_bytes`; `SecretFileMissing` (a ConfigError) for one that does not exist. A file
    that group or others may access is read, with a warning naming it.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
            mode = os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        raise SecretFileMissing(f"{key}: {path} cannot be read (No such file or directory)") from None
    except OSError as exc:
        raise ConfigError(f"{key}: {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text") from None
    secret = text.strip() if strip else text.removesuffix("\n").removesuffix("\r")
    if len(secret.encode("utf-8")) < min_bytes:
        raise ConfigError(f"{key}: {path} holds fewer than {min_bytes} bytes")
    warn_if_exposed(key, path, mode)
    return secret
