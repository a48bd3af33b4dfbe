"""Model weights the node can see: model folders under the configured model directories.

A model folder holds a config.json and weight files (a GGUF file is a model on
its own: it carries its config). The scan runs every scan interval, and a
filer may hold thousands of models over a slow network: so each directory is
listed again only when its mtime changed, and each model folder is measured
again only when it changed. An unchanged tree costs one stat per directory.

A folder's mtime moves when a file is added, removed or renamed, not while a
file copied in place keeps growing: so a reading is trusted only once the
folder had been quiet for a while when it was read, and a folder that changed
recently (a download in progress) is read again on every scan until it settles.
"""

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.discovery.rootfs import host_path
from agent.discovery.weights_state import WeightsJudge

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
# Deep enough for org/model and for the Hugging Face cache layout
# (hub/models--org--name/snapshots/<revision>), shallow enough not to wander a filer.
MAX_DEPTH = 5
# How long a folder must have been unchanged, when read, for the reading to be
# reused: longer than copying a large weight file in place takes.
SETTLED_SECONDS = 3600.0


@dataclass(frozen=True)
class Weights:
    path: str
    # None when the folder could not be measured.
    size_bytes: int | None


def folder_size(path: str) -> int:
    """Bytes in the regular files under `path`, following file symlinks (the HF cache's blobs)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # a dangling symlink or a file deleted mid-walk holds no bytes
    return total


@dataclass(frozen=True)
class _Listing:
    subdirs: tuple[str, ...]
    is_model: bool


@dataclass(frozen=True)
class _Seen:
    """A directory as last read: trusted while its (inode, mtime) stays the same."""

    stamp: tuple[int, int]
    read_at: float
    listing: _Listing
    size: int | None = None


def _is_model(files: set[str]) -> bool:
    weights = any(name.endswith(WEIGHT_SUFFIXES) for name in files)
    gguf = any(name.endswith(".gguf") for name in files)
    return gguf or ("config.json" in files and weights)


class WeightsScanner:
    """Finds model folders, remembering what it read so a rescan skips unchanged folders."""

    def __init__(
        self,
        root: str,
        measure: Callable[[str], int] = folder_size,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self._measure = measure
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        # Each found folder's state (agent/discovery/weights_state.py), judged after a scan.
        self.judge = WeightsJudge()

    def scan(self, directories: Iterable[str], warn: Callable[[str], None]) -> list[Weights]:
        """The model folders under `directories` (which must exist), sorted by path."""
        found: list[Weights] = []
        seen_now: dict[str, _Seen] = {}
        visited: set[tuple[int, int]] = set()
        for directory in directories:
            self._visit(directory, 0, found, seen_now, visited, warn)
        # Forget folders that are gone, so the memory follows the tree.
        self._seen = seen_now
        return sorted(found, key=lambda w: w.path)

    def _visit(
        self,
        path: str,
        depth: int,
        found: list[Weights],
        seen_now: dict[str, _Seen],
        visited: set[tuple[int, int]],
        warn: Callable[[str], None],
    ) -> None:
        real = str(host_path(self.root, path))
        try:
            st = os.stat(real)
        except OSError as e:
            warn(f"weights: cannot stat {path} ({e.strerror}): skipped")
            return
        if (st.st_dev, st.st_ino) in visited:
            return  # a symlink loop, or two configured directories that overlap
        visited.add((st.st_dev, st.st_ino))

        stamp = (st.st_ino, st.st_mtime_ns)
        before = self._seen.get(path)
        trusted = (
            before is not None
            and before.stamp == stamp
            and before.read_at - st.st_mtime_ns / 1e9 > SETTLED_SECONDS
        )
        if trusted and before is not None:
            entry = before
        else:
            listing = self._list(real, path, warn)
            if listing is None:
                return
            entry = _Seen(stamp, self._clock(), listing)

        if entry.listing.is_model:
            if not trusted:
                size = self._size(real, path, warn)
                entry = _Seen(entry.stamp, entry.read_at, entry.listing, size)
            seen_now[path] = entry
            found.append(Weights(path, entry.size))
            return
        seen_now[path] = entry
        if depth < MAX_DEPTH:
            for name in entry.listing.subdirs:
                self._visit(os.path.join(path, name), depth + 1, found, seen_now, visited, warn)

    def _list(self, real: str, path: str, warn: Callable[[str], None]) -> _Listing | None:
        try:
            with os.scandir(real) as entries:
                subdirs, files = [], set()
                for entry in entries:
                    # Hidden directories are caches and filer snapshots
                    # (.cache, .git, NetApp's .snapshot), never models, and
                    # walking .snapshot would read every model many times over.
                    if entry.is_dir() and not entry.name.startswith("."):
                        subdirs.append(entry.name)
                    elif entry.is_file():
                        files.add(entry.name)
        except OSError as e:
            warn(f"weights: cannot list {path} ({e.strerror}): skipped")
            return None
        return _Listing(tuple(sorted(subdirs)), _is_model(files))

    def _size(self, real: str, path: str, warn: Callable[[str], None]) -> int | None:
        try:
            return self._measure(real)
        except OSError as e:
            warn(f"weights: cannot measure {path} ({e.strerror})")
            return None
