"""Disk space, per filesystem rather than per model directory.

Free space belongs to the disk, not the path: two model directories on one
disk are one pool of bytes, and reporting them apart would let the control
plane add 24 GB to 24 GB and place a 40 GB model on a node that has 24.
Filesystems that other nodes mount too are flagged shared, so the service can
keep a filer's free terabyte out of every node's own total.
"""

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.discovery.mountinfo import Mount, mount_of, read_mountinfo
from agent.discovery.rootfs import host_path, node_view

# Network and cluster filesystems: space on them belongs to every node that mounts them.
SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",  # the kernel client's type for CephFS
        "cephfs",
        "ceph-fuse",
        "glusterfs",
    }
)


class SpaceFigures(Protocol):
    @property
    def f_frsize(self) -> int: ...
    @property
    def f_blocks(self) -> int: ...
    @property
    def f_bavail(self) -> int: ...


class DeviceFigures(Protocol):
    @property
    def st_dev(self) -> int: ...


@dataclass(frozen=True)
class Filesystem:
    # Stable on its node: the device number, e.g. "dev:259:1".
    id: str
    mount_point: str
    fs_type: str | None
    shared: bool
    free_bytes: int
    total_bytes: int
    # The configured model directories that live on it, in configured order.
    directories: tuple[str, ...]


def is_shared(fs_type: str, extra_types: Iterable[str] = ()) -> bool:
    kind = fs_type.lower()
    known = SHARED_FS_TYPES | {t.lower() for t in extra_types}
    # FUSE clients name themselves fuse.<type>: fuse.glusterfs, fuse.ceph-fuse.
    return kind in known or kind.removeprefix("fuse.") in known


def present_model_dirs(
    root: str, model_dirs: Iterable[str], warn: Callable[[str], None]
) -> list[str]:
    """The configured model directories that exist, warning about each one that does not.

    A missing directory is what an unmounted filer looks like. Skipping it
    leaves its space unknown; reporting it would say the node has none.
    """
    present = []
    for directory in model_dirs:
        if host_path(root, directory).is_dir():
            present.append(directory)
        else:
            warn(f"model directory {directory} does not exist (an unmounted filer?): skipped")
    return present


def discover_storage(
    root: str,
    directories: Sequence[str],
    extra_shared_types: Iterable[str],
    warn: Callable[[str], None],
    statvfs: Callable[[str], SpaceFigures] = os.statvfs,
    stat: Callable[[str], DeviceFigures] = os.stat,
) -> list[Filesystem]:
    """One entry per filesystem holding any of `directories` (which must exist)."""
    mounts = read_mountinfo(root)
    groups: dict[int, list[str]] = {}
    for directory in directories:
        try:
            device = stat(str(host_path(root, directory))).st_dev
        except OSError as e:
            warn(f"model directory {directory}: cannot stat it ({e.strerror}): skipped")
            continue
        groups.setdefault(device, []).append(directory)

    filesystems = []
    for device, members in groups.items():
        first = str(host_path(root, members[0]))
        try:
            space = statvfs(first)
        except OSError as e:
            warn(f"model directory {members[0]}: statvfs failed ({e.strerror}): skipped")
            continue
        mount = _mount_for(root, first, mounts)
        if mount is None:
            warn(f"model directory {members[0]}: no mount holds it in /proc/self/mountinfo")
        fs_type = mount.fs_type if mount else None
        filesystems.append(
            Filesystem(
                id=f"dev:{os.major(device)}:{os.minor(device)}",
                mount_point=mount.mount_point if mount else members[0],
                fs_type=fs_type,
                shared=is_shared(fs_type, extra_shared_types) if fs_type else False,
                free_bytes=space.f_bavail * space.f_frsize,
                total_bytes=space.f_blocks * space.f_frsize,
                directories=tuple(members),
            )
        )
    return sorted(filesystems, key=lambda fs: (fs.mount_point, fs.id))


def _mount_for(root: str, real_path: str, mounts: list[Mount]) -> Mount | None:
    # Resolve symlinks first: /data/models -> /mnt/nvme0/models lives on /mnt/nvme0.
    view = node_view(root, os.path.realpath(real_path))
    return mount_of(view, mounts) if view is not None else None
