"""A fake node: a directory tree laid out like a host's /, and its disks.

Every host file the agent reads is resolved under its configured root, so a
test builds the files a real DGX-style node has and points the agent at them.
The disks are the one thing a tree under /tmp cannot fake (every directory in
it is on the same real disk), so `FakeDisks` answers stat and statvfs by path.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from agent.discovery.rootfs import node_view

GIB = 1 << 30
TIB = 1 << 40

# A DGX H100-like node: root on NVMe, models on an md RAID of NVMe (xfs), a
# scratch ext4, an NFS filer and a Lustre scratch filesystem.
MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
61 22 9:127 / /data rw,relatime shared:30 - xfs /dev/md127 rw,attr2,inode64,noquota
62 22 259:5 / /scratch rw,relatime shared:31 - ext4 /dev/nvme1n1p1 rw
63 22 0:53 / /mnt/filer rw,relatime shared:32 - nfs4 filer01:/export/models rw,vers=4.2
64 22 0:60 / /lustre rw,relatime shared:33 - lustre 10.0.0.1@o2ib:/scratch rw,flock
65 22 0:61 / /mnt/my\\040models rw,relatime shared:34 - fuse.weka wekafs rw
"""

# (device major, minor, total bytes, free bytes) of each mount.
DISKS = {
    "/": (259, 2, 2 * TIB, 1 * TIB),
    "/data": (9, 127, 28 * TIB, 20 * TIB),
    "/scratch": (259, 5, 7 * TIB, 6 * TIB),
    "/mnt/filer": (0, 53, 500 * TIB, 100 * TIB),
    "/lustre": (0, 60, 5000 * TIB, 900 * TIB),
    "/mnt/my models": (0, 61, 100 * TIB, 50 * TIB),
}


def write(root: Path, path: str, text: str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def add_hca(root: Path, hca: str, ports: dict[int, tuple[str, str]]) -> None:
    """ports: number -> (state, rate), as the kernel writes them: ("4: ACTIVE", "400 Gb/sec (4X NDR)")."""
    for number, (state, rate) in ports.items():
        write(root, f"/sys/class/infiniband/{hca}/ports/{number}/state", state + "\n")
        write(root, f"/sys/class/infiniband/{hca}/ports/{number}/rate", rate + "\n")


def add_model(root: Path, path: str, files: dict[str, int]) -> Path:
    """A folder of files of the given sizes (sparse, so terabytes cost nothing)."""
    folder = root / path.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.truncate(size)
    return folder


def add_process(root: Path, pid: int, comm: str, argv: list[str]) -> None:
    write(root, f"/proc/{pid}/comm", comm + "\n")
    write(root, f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")


def make_node(root: Path) -> Path:
    """The files of a node with 2 TiB of RAM, the mounts above and one fabric of two HCAs."""
    write(root, "/etc/machine-id", "4c4c4544004e3510804bc4c04f4e3633\n")
    write(root, "/proc/sys/kernel/random/boot_id", "0f6b1e52-8d52-4a53-9e33-6f0c4a7d5b21\n")
    write(
        root,
        "/proc/meminfo",
        "MemTotal:       2113612800 kB\nMemFree:        2000000000 kB\n"
        "MemAvailable:   2050000000 kB\n",
    )
    write(root, "/proc/self/mountinfo", MOUNTINFO)
    for mount in DISKS:
        (root / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
    add_hca(root, "mlx5_0", {1: ("4: ACTIVE", "400 Gb/sec (4X NDR)")})
    add_hca(root, "mlx5_1", {1: ("4: ACTIVE", "400 Gb/sec (4X NDR)")})
    return root


@dataclass
class FakeDisks:
    """stat and statvfs for paths under `root`, answered from the mount they fall on."""

    root: Path

    def _disk(self, path: str) -> tuple[int, int, int, int]:
        view = node_view(str(self.root), os.path.realpath(path))
        assert view is not None, f"{path} is outside the fake root"
        mount = max(
            (m for m in DISKS if m == "/" or view == m or view.startswith(m + "/")), key=len
        )
        return DISKS[mount]

    def stat(self, path: str) -> SimpleNamespace:
        major, minor, _, _ = self._disk(path)
        return SimpleNamespace(st_dev=os.makedev(major, minor))

    def statvfs(self, path: str) -> SimpleNamespace:
        _, _, total, free = self._disk(path)
        block = 4096
        # f_bfree counts the root-reserved blocks too; f_bavail is what an engine can use.
        return SimpleNamespace(
            f_frsize=block,
            f_blocks=total // block,
            f_bfree=free // block + 1000,
            f_bavail=free // block,
        )
