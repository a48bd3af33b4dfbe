"""The mount table, from /proc/self/mountinfo."""

import os
import re
from dataclasses import dataclass

from agent.discovery.rootfs import host_path, node_view


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fs_type: str
    source: str


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as \040 and the like.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mountinfo(root: str) -> list[Mount]:
    """Every mount, in the kernel's order (a later mount on the same point hides an earlier one).

    Mount points under `root` are given in the host's terms: in a container
    that mounts the host at /host, its /host/data is the node's /data, which is
    the name the configured model directories use.
    """
    try:
        text = host_path(root, "/proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        # id parent major:minor root mount-point options [optional...] - type source super-options
        fields = line.split()
        try:
            dash = fields.index("-", 6)
        except ValueError:
            continue
        if dash + 2 >= len(fields):
            continue
        point = _unescape(fields[4])
        point = node_view(root, point) or point
        mounts.append(Mount(point, fields[dash + 1], _unescape(fields[dash + 2])))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path`: the deepest mount point above it, the last mounted on a tie."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point
        inside = point == "/" or path == point or path.startswith(point.rstrip(os.sep) + os.sep)
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best
