"""Who this node is, when the configuration does not say."""

import socket
from urllib.parse import urlsplit

from agent.discovery.rootfs import host_path


def read_machine_id(root: str) -> str | None:
    """/etc/machine-id, the id systemd gives the installed system; None when absent.

    It survives reboots and renames, which is what a node id must do: a node that
    came back with a new id would be a stranger holding the old one's GPUs.
    """
    try:
        text = host_path(root, "/etc/machine-id").read_text().strip()
    except OSError:
        return None
    return text or None


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_boot_id(root: str) -> str | None:
    """The kernel's id for this boot; None when unreadable.

    A new one tells the service the node rebooted, which reset its GPUs: the
    sticky health a critical XID left on them is then cleared.
    """
    try:
        text = host_path(root, BOOT_ID).read_text().strip()
    except OSError:
        return None
    return text or None


def default_mgmt_addr(service_url: str) -> str:
    """The local address this node reaches the service from.

    Connecting a UDP socket sends nothing; it only asks the kernel which source
    address the route to the service uses, which is the address the service can
    reach back. Falls back to the hostname when there is no such route.
    """
    host = urlsplit(service_url).hostname or "127.0.0.1"
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()
