"""The node agent: discovers a GPU node and keeps the inventory service's view of it true."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmgw-agent")
except PackageNotFoundError:
    # Run from a source checkout that was never installed: say so rather than
    # report a version that might match a real release.
    __version__ = "0+source"
