"""The node's RAM, from /proc/meminfo."""

from agent.discovery.rootfs import host_path


def read_meminfo(root: str) -> int | None:
    """MemTotal in MiB; None when it cannot be read.

    None rather than 0: the service reads a missing figure as "no constraint",
    while 0 would make the node look too small for every model.
    """
    try:
        text = host_path(root, "/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemTotal":
            fields = rest.split()
            if fields and fields[0].isdigit():
                # The kernel writes "kB" but means KiB.
                return int(fields[0]) // 1024
    return None
