"""Where each model folder stands: DOWNLOADING, READY, EVICTING or FAILED, from markers on disk.

The markers (docs/scheduler/weights.md, "The agent's markers"), checked in
this order for a model folder the scanner found (agent/discovery/weights.py):

1. `.evicting` in the folder: EVICTING. An eviction tool writes it before it
   deletes anything, so a replica pinned to the weights is told before they go.
2. The folder's size changed since the last scan, a file named `*.incomplete`
   (what Hugging Face's hub writes while it downloads, also in the repo's
   blobs/ for a snapshot), a symlink to a blob that is not there yet, or a
   `.downloading` marker: DOWNLOADING. `.downloading` may hold the expected
   total size in bytes (a decimal number), which is reported as totalBytes.
3. `.complete` holding `sha256:<64 hex>`: READY when it equals the folder's
   manifest digest, FAILED when it does not (or the marker is malformed).
4. A Hugging Face snapshot (…/models--org--name/snapshots/<revision>): READY
   when a file under the repo's refs/ names <revision> (the hub writes the ref
   once the snapshot's files are in place), else DOWNLOADING. The revision is
   reported.
5. Otherwise: no state (present, state unknown), as agents before states.

The manifest digest is sha256 over one line `<relative path>\\t<size>\\n` per
regular file under the folder (following symlinks, markers left out), sorted
by path. It costs a stat per file and reads no file's content: it catches a
file missing, added or truncated (the usual ways a copy or download goes
wrong), not a flipped bit inside a file of the right size. It is computed
again only when the folder's size or its `.complete` marker changed, and on
each scan while the folder is DOWNLOADING.
"""

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

COMPLETE = ".complete"
EVICTING = ".evicting"
DOWNLOADING = ".downloading"
INCOMPLETE_SUFFIX = ".incomplete"
MARKERS = frozenset({COMPLETE, EVICTING, DOWNLOADING})
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Big enough for any marker this module writes or reads.
MAX_MARKER_BYTES = 4096


@dataclass(frozen=True)
class WeightsStatus:
    # The contract's WeightsState name, or None (not known).
    state: str | None
    revision: str | None = None
    total_bytes: int | None = None
    digest: str | None = None


@dataclass(frozen=True)
class _Walk:
    digest: str
    # An *.incomplete file or a dangling symlink was found.
    incomplete: bool


def manifest_digest(folder: str) -> _Walk:
    """The folder's manifest digest (see the module's docstring) and whether it is incomplete."""
    lines: list[str] = []
    incomplete = False
    for dirpath, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files:
            full = os.path.join(dirpath, name)
            relative = os.path.relpath(full, folder)
            if relative in MARKERS:
                continue
            if name.endswith(INCOMPLETE_SUFFIX):
                incomplete = True
            try:
                size = os.stat(full).st_size
            except OSError:
                incomplete = True  # a symlink to a blob not downloaded yet
                continue
            lines.append(f"{relative}\t{size}\n")
    lines.sort()
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    return _Walk(f"sha256:{digest}", incomplete)


def _read_marker(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_MARKER_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _hugging_face_snapshot(folder: str) -> tuple[str, str] | None:
    """(repo folder, revision) when `folder` is <repo>/snapshots/<revision> of a hub cache."""
    snapshots, revision = os.path.split(os.path.normpath(folder))
    repo, name = os.path.split(snapshots)
    if name == "snapshots" and os.path.basename(repo).startswith("models--"):
        return repo, revision
    return None


def _names_revision(repo: str, revision: str) -> bool:
    refs = os.path.join(repo, "refs")
    for dirpath, _dirs, files in os.walk(refs):
        for name in files:
            if _read_marker(os.path.join(dirpath, name)) == revision:
                return True
    return False


def _blobs_incomplete(repo: str) -> bool:
    try:
        return any(n.endswith(INCOMPLETE_SUFFIX) for n in os.listdir(os.path.join(repo, "blobs")))
    except OSError:
        return False


def _expected_total(folder: str) -> int | None:
    text = _read_marker(os.path.join(folder, DOWNLOADING))
    return int(text) if text and text.isdigit() else None


@dataclass(frozen=True)
class _Judged:
    size: int | None
    complete: tuple[int, int] | None
    status: WeightsStatus


class WeightsJudge:
    """Decides each model folder's state, remembering sizes so growth between scans shows."""

    def __init__(self) -> None:
        self._last: dict[str, _Judged] = {}

    def judge_all(
        self,
        folders: list[tuple[str, str, int | None]],
        warn: Callable[[str], None],
    ) -> list[WeightsStatus]:
        """For (reported path, real path, size) of each folder, in order; forgets the others."""
        seen: dict[str, _Judged] = {}
        out = []
        for path, real, size in folders:
            judged = self._judge(path, real, size, warn)
            seen[path] = judged
            out.append(judged.status)
        self._last = seen
        return out

    def _judge(
        self, path: str, real: str, size: int | None, warn: Callable[[str], None]
    ) -> _Judged:
        complete = _stamp(os.path.join(real, COMPLETE))
        before = self._last.get(path)
        if os.path.lexists(os.path.join(real, EVICTING)):
            return _Judged(size, complete, WeightsStatus("EVICTING"))
        if before is not None and before.size != size:
            # Still growing (or shrinking): whatever the markers say, not done.
            return _Judged(size, complete, self._downloading(real, size, None))
        if (
            before is not None
            and before.complete == complete
            and before.status.state != "DOWNLOADING"
        ):
            # Unchanged since it was read, and not waiting on a marker or a ref.
            return before
        return _Judged(size, complete, self._read(path, real, size, warn))

    def _downloading(self, real: str, size: int | None, revision: str | None) -> WeightsStatus:
        total = _expected_total(real)
        if total is not None and size is not None and size > total:
            total = None  # the expected size was wrong: a report with size > total is refused
        return WeightsStatus("DOWNLOADING", revision, total)

    def _read(
        self, path: str, real: str, size: int | None, warn: Callable[[str], None]
    ) -> WeightsStatus:
        snapshot = _hugging_face_snapshot(real)
        revision = snapshot[1] if snapshot else None
        walk = manifest_digest(real)
        if (
            walk.incomplete
            or os.path.lexists(os.path.join(real, DOWNLOADING))
            or (snapshot is not None and _blobs_incomplete(snapshot[0]))
        ):
            return self._downloading(real, size, revision)
        marker = _read_marker(os.path.join(real, COMPLETE))
        if marker is not None:
            if marker == walk.digest:
                return WeightsStatus("READY", revision, size, walk.digest)
            wanted = marker if DIGEST.fullmatch(marker) else "a malformed marker"
            warn(f"weights: {path}: {COMPLETE} says {wanted}, the files are {walk.digest}: FAILED")
            return WeightsStatus("FAILED", revision, None, walk.digest)
        if snapshot is not None:
            if _names_revision(snapshot[0], snapshot[1]):
                return WeightsStatus("READY", revision, size, walk.digest)
            return replace(self._downloading(real, size, revision), revision=revision)
        return WeightsStatus(None)
