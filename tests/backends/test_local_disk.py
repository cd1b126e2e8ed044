"""Which filesystem a file is on: the users file's lookups stat it on the loop only on a local disk."""

from __future__ import annotations

import pytest

from backends.local_disk import filesystem_type, on_local_disk

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:40 / /srv/shared rw,relatime shared:12 - nfs4 fs:/export rw,vers=4.2
31 30 0:41 / /srv/shared/local rw,relatime - tmpfs tmpfs rw
32 27 0:42 / /mnt/my\\040disk rw,relatime - xfs /dev/vdb rw
33 27 0:43 / /mnt/box rw,relatime - fuse.sshfs host: rw
34 27 0:44 / /var/lib/homeserver rw,relatime - ext4 /dev/vdc rw
35 34 0:45 / /var/lib/homeserver rw,relatime - cifs //nas/hs rw
"""


@pytest.fixture
def mountinfo(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


@pytest.mark.parametrize(
    ("path", "kind", "local"),
    [
        ("/etc/homeserver/users.json", "ext4", True),
        ("/srv/shared/users.json", "nfs4", False),  # optional fields before "-" are skipped
        ("/srv/shared/local/users.json", "tmpfs", True),  # the longest mount point wins
        ("/srv/sharedx/users.json", "ext4", True),  # a prefix of the name is not a parent folder
        ("/mnt/my disk/users.json", "xfs", True),  # an escaped space in the mount point
        ("/mnt/box/users.json", "fuse.sshfs", False),
        ("/var/lib/homeserver/users.json", "cifs", False),  # mounted over: the last mount counts
    ],
)
def test_the_filesystem_of_a_path(mountinfo, path, kind, local):
    assert filesystem_type(path, mountinfo) == kind
    assert on_local_disk(path, mountinfo) is local


def test_without_a_mount_table_the_disk_counts_as_remote(tmp_path):
    assert filesystem_type("/etc/hosts", str(tmp_path / "missing")) is None
    assert on_local_disk("/etc/hosts", str(tmp_path / "missing")) is False


def test_a_symbolic_link_is_followed_to_its_file(mountinfo, tmp_path, monkeypatch):
    monkeypatch.setattr("os.path.realpath", lambda p: "/srv/shared/users.json" if p == "/etc/users.json" else p)
    assert on_local_disk("/etc/users.json", mountinfo) is False
