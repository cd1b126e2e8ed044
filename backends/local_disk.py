"""Whether a file lies on a local filesystem, where a stat answers in microseconds.

The users file's lookups check its signature on the event loop when it does (a stat there is
cheaper than a round trip to a thread, measured under the realistic mix: docs/performance.md),
and off the loop when it may not: a network filesystem (or one served by a user-space daemon)
can keep a stat waiting as long as the server it asks, and the loop must not wait with it.
"""

from __future__ import annotations

import os
import re

MOUNTINFO = "/proc/self/mountinfo"
# Filesystems whose stat may wait on another machine or on a daemon ("fuse.*" too).
REMOTE_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "ceph", "glusterfs", "9p", "afs", "coda", "lustre", "gpfs",
    "ocfs2", "gfs2", "davfs", "sshfs", "fuse", "fuseblk", "virtiofs",
})
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str, mountinfo: str = MOUNTINFO) -> str | None:
    """The type of the filesystem `path` is on (its longest mount point), or None when the
    mount table cannot be read (not Linux, no /proc)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, found = -1, None
    for line in lines:
        fields = line.split(" ")
        if "-" not in fields or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # Later lines mount over earlier ones at the same point: >= keeps the last.
        if inside and len(point) >= best:
            kind = fields[fields.index("-") + 1 :]
            if kind:
                best, found = len(point), kind[0]
    return found


def on_local_disk(path: str, mountinfo: str = MOUNTINFO) -> bool:
    """True when `path` is on a filesystem of this machine; False when remote, or unknown."""
    kind = filesystem_type(path, mountinfo)
    return kind is not None and kind not in REMOTE_TYPES and not kind.startswith("fuse.")
