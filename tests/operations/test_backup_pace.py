"""A paced backup (LLMGW_BACKUP_PACE): stopped for part of every period, finished all the same.

docs/operations/backup.md ("The backup's cost") promises that the schedule's
backups run for only that share of the time, so that a running full backup
takes at most that share of what it would from the database and the service,
and that a wrong setting is refused naming it. The schedule
(deploy/backup/llmgw_backup.py) runs inside the database containers; here its
pacing runs a real process group on this machine.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO


def load_schedule() -> ModuleType:
    name = "llmgw_backup_schedule"
    spec = importlib.util.spec_from_file_location(
        name, REPO / "deploy" / "backup" / "llmgw_backup.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


schedule = load_schedule()


def states_of(pid_file: Path, until: threading.Event) -> list[str]:
    """The process state (R, S, T...) of the pid written to `pid_file`, sampled every 10 ms."""
    seen: list[str] = []
    while not until.is_set():
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            try:
                stat = Path(f"/proc/{text}/stat").read_text()
            except FileNotFoundError:
                break
            seen.append(stat.rsplit(")", 1)[1].split()[0])
        time.sleep(0.01)
    return seen


@pytest.mark.process
def test_a_paced_backup_is_stopped_part_of_each_period_and_ends_with_its_output_and_exit_code(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    command = ["sh", "-c", f"echo $$ > {pid_file}; echo started; sleep 1.2; echo ended >&2; exit 3"]
    done_event = threading.Event()
    seen: list[str] = []
    sampler = threading.Thread(target=lambda: seen.extend(states_of(pid_file, done_event)))
    sampler.start()
    try:
        started = time.monotonic()
        done = schedule.run_paced(command, 0.25)
        took = time.monotonic() - started
    finally:
        done_event.set()
        sampler.join(timeout=5)
    assert done.returncode == 3
    assert done.stdout.split() == ["started", "ended"]
    # Stopped (T) for most of each 0.2 s period, running (here: sleeping, S) for the rest.
    assert seen.count("T") > len(seen) / 2, seen
    assert "S" in seen, seen
    assert took >= 1.2


@pytest.mark.process
def test_an_unpaced_backup_is_never_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = ["sh", "-c", f"echo $$ > {pid_file}; sleep 0.6"]
    done_event = threading.Event()
    seen: list[str] = []
    sampler = threading.Thread(target=lambda: seen.extend(states_of(pid_file, done_event)))
    sampler.start()
    try:
        done = schedule.run_paced(command, 1.0)
    finally:
        done_event.set()
        sampler.join(timeout=5)
    assert done.returncode == 0
    assert seen and "T" not in seen, seen


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.5", "fast", ""])
def test_a_pace_that_is_not_a_share_of_the_time_is_refused_naming_it(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_BACKUP_PACE", raw)
    with pytest.raises(SystemExit) as refused:
        schedule.pace()
    assert str(refused.value).startswith(f"LLMGW_BACKUP_PACE={raw!r}: must be a share of the time")


def test_the_pace_is_read_as_a_share_and_unset_is_unpaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_BACKUP_PACE", "0.25")
    assert schedule.pace() == 0.25
    monkeypatch.delenv("LLMGW_BACKUP_PACE")
    assert schedule.pace() == 1.0
