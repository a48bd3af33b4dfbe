"""Where the agent reads the host's files.

Every host path the agent reads (/proc, /sys, /etc, the model directories) goes
through `host_path`, so one setting points the agent at a container's view of
the host (`root = "/host"`) and a test points it at a fake tree. A path read
directly anywhere else would silently describe the container, not the node.
"""

import os
from pathlib import Path


def host_path(root: str, path: str) -> Path:
    """The file that holds the host's `path` when the host's / is at `root`."""
    return Path(root, path.lstrip("/"))


def node_view(root: str, real: str) -> str | None:
    """The host's name for `real`, a path under `root`; None when it lies outside it.

    Used after resolving symlinks, which may lead out of a fake or mounted root.
    """
    base = os.path.realpath(root)
    if base == "/":
        return real
    if real == base:
        return "/"
    if real.startswith(base + os.sep):
        return real[len(base) :]
    return None
