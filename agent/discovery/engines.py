"""Versions of the serving engines installed beside the agent.

The engine version decides which metric names and command-line flags apply,
so the control plane needs it before it starts a replica on the node.
"""

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

ENGINES = ("vllm", "sglang", "tensorrt-llm")


def engine_versions(version_of: Callable[[str], str] = version) -> dict[str, str]:
    """Installed engines by distribution name; absent ones are left out."""
    found = {}
    for engine in ENGINES:
        try:
            found[engine] = version_of(engine)
        except PackageNotFoundError:
            continue
    return found
