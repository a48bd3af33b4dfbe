#!/usr/bin/env python3
"""pgBackRest beside each PostgreSQL of the compose files: the schedule, the status, restores.

Runs inside the database containers (deploy/ha/patroni.Dockerfile for the HA
members, deploy/backup/postgres.Dockerfile for the single-node demo), where
pgbackrest, psql and the data directory are local. Standard library only.
docs/operations/backup.md is the contract; each command here is a step it
names:

- `schedule`: forever, every LLMGW_BACKUP_CHECK_EVERY seconds. Only on the
  primary (Patroni's GET /primary answers 200, when LLMGW_BACKUP_PATRONI is
  set; and PostgreSQL is out of recovery): creates the stanza once, takes a
  full backup when the repository holds none (so one at start) or the newest
  full is older than LLMGW_BACKUP_FULL_EVERY, an incremental when the newest
  backup is older than LLMGW_BACKUP_INCR_EVERY or not on the current timeline
  (after a failover or a restore, so that new replicas can be built from the
  repository on the new timeline), and writes what the repository holds to the
  table backups.status (deploy/backup/status.sql), which the service reports
  as metrics and in /readyz. A backup that fails, and a repository that cannot
  be read, are written there too (last_error), and logged: the database goes on
  serving either way.
- `range`: the restorable range as JSON (oldest backup's end .. now).
- `request-restore TARGET`: checks TARGET ("latest" or a time) against the
  range, refusing one outside it with the range named, and leaves the request
  on the repository volume for the next bootstrap of an empty cluster.
- `bootstrap`: Patroni's custom bootstrap method (and the single-node
  entrypoint's restore): restores the requested target from the repository
  (pgBackRest picks the backup set for a time target) so that PostgreSQL
  recovers to it and promotes: a new timeline.
- `on-role-change`: Patroni's on_role_change callback. On the member just
  promoted, pushes to the repository every complete WAL segment in its pg_wal
  that it received as a standby (marked .done: a standby with archive_mode on
  archives nothing) and that the repository lacks: what the old leader had
  finished but not archived when it died. Without it the archive would have
  a gap at each failover, and no restore could cross it.
- `replica`: Patroni's create_replica_methods entry: builds a replica from the
  newest backup that lies on the leader's timeline history (the leader's
  .history file from the archive), or fails so Patroni falls back to
  pg_basebackup. A backup taken on the old timeline after a restore's target
  would leave the replica on a timeline the leader never had (patroni #3147).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

STANZA = os.environ.get("PGBACKREST_STANZA", "llmgw")
REPO = Path(os.environ.get("PGBACKREST_REPO1_PATH", "/var/lib/pgbackrest"))
REQUEST = REPO / "llmgw-restore-request.json"
BACKUP_LOCK = REPO / "llmgw-backup.lock"
STATUS_SQL = Path(os.environ.get("LLMGW_BACKUP_STATUS_SQL", "/usr/local/share/llmgw/status.sql"))


def log(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{stamp} llmgw-backup: {message}", file=sys.stderr, flush=True)


def seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def pgbackrest(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pgbackrest", f"--stanza={STANZA}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {done.returncode}"


class RepositoryError(Exception):
    """The repository could not be read (unreachable, corrupt, wrong key)."""


def repository_info() -> dict[str, Any]:
    """pgbackrest info for the stanza (an empty dict when the stanza does not exist yet)."""
    done = pgbackrest("info", "--output=json", timeout=120)
    if done.returncode != 0:
        raise RepositoryError(last_line(done))
    stanzas = json.loads(done.stdout or "[]")
    info: dict[str, Any] = stanzas[0] if stanzas else {}
    # pgbackrest answers 0 for a repository it cannot read, with a status code in the
    # JSON: 0 ok, 1 missing stanza path (created next), 2 no valid backup yet; anything
    # else (99: permission denied, a corrupt info file, a wrong key...) is unreadable.
    code = (info.get("status") or {}).get("code", 0)
    if code not in (0, 1, 2):
        reasons = [r.get("status", {}).get("message") for r in info.get("repo") or []]
        raise RepositoryError("; ".join(m for m in reasons if m) or str(info.get("status")))
    return info


def backups(info: dict[str, Any]) -> list[dict[str, Any]]:
    return list(info.get("backup") or [])


def stanza_missing(info: dict[str, Any]) -> bool:
    # pgbackrest's status code 1: "missing stanza path".
    return not info or (info.get("status") or {}).get("code") == 1


def utc(epoch: float | int | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()


def restorable_range(info: dict[str, Any]) -> tuple[float, float] | None:
    """(oldest backup's end, now) in epoch seconds; None when there is no backup."""
    sets = backups(info)
    if not sets:
        return None
    return min(b["timestamp"]["stop"] for b in sets), time.time()


# --- what runs on the primary -------------------------------------------------------------------


def is_primary() -> bool:
    patroni = os.environ.get("LLMGW_BACKUP_PATRONI")
    if patroni:
        try:
            with urllib.request.urlopen(f"{patroni}/primary", timeout=2) as answer:
                if answer.status != 200:
                    return False
        except (urllib.error.URLError, OSError):
            return False
    return psql_value("SELECT NOT pg_is_in_recovery()") == "t"


def psql(sql: str, variables: dict[str, str] | None = None, database: str | None = None) -> str:
    command = [
        "psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1",
        "-U", os.environ.get("LLMGW_BACKUP_DB_USER", "postgres"),
        "-d", database or os.environ.get("LLMGW_BACKUP_DATABASE", "llmgw"),
    ]  # fmt: skip
    for name, value in (variables or {}).items():
        command += ["-v", f"{name}={value}"]
    done = subprocess.run(command, input=sql, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(last_line(done))
    return done.stdout.strip()


def psql_value(sql: str) -> str:
    try:
        return psql(sql, database="postgres")
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return ""


def current_timeline() -> int:
    """The timeline WAL is being written on (pg_control's lags a promotion until a checkpoint)."""
    return int(
        psql(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int",
            database="postgres",
        )
    )


def timeline_of(backup: dict[str, Any]) -> int:
    return int(backup["archive"]["stop"][:8], 16)


def due(info: dict[str, Any], now: float, timeline: int) -> str | None:
    """The type of backup to take now (full, incr), or None."""
    sets = backups(info)
    fulls = [b for b in sets if b["type"] == "full"]
    if not fulls:
        return "full"
    if now - max(b["timestamp"]["stop"] for b in fulls) >= seconds(
        "LLMGW_BACKUP_FULL_EVERY", 86400
    ):
        return "full"
    newest = max(sets, key=lambda b: b["timestamp"]["stop"])
    if timeline_of(newest) != timeline:
        return "incr"
    if now - newest["timestamp"]["stop"] >= seconds("LLMGW_BACKUP_INCR_EVERY", 3600):
        return "incr"
    return None


# One run-and-pause cycle of a paced backup (LLMGW_BACKUP_PACE), in seconds: short
# enough that the database and the service never wait long behind a running burst.
PACE_PERIOD = 0.2


def pace() -> float:
    """LLMGW_BACKUP_PACE: the share of the time a backup may run (1: unpaced)."""
    raw = os.environ.get("LLMGW_BACKUP_PACE", "1")
    try:
        share = float(raw)
    except ValueError:
        share = 0.0
    if not 0 < share <= 1:
        raise SystemExit(
            f"LLMGW_BACKUP_PACE={raw!r}: must be a share of the time, above 0 and at most 1"
        )
    return share


def run_paced(command: list[str], share: float) -> subprocess.CompletedProcess[str]:
    """Run `command` (in a process group of its own) for `share` of every PACE_PERIOD and
    stop it (SIGSTOP to the group: pgBackRest's worker processes too) for the rest.

    A backup's CPU and disk work is the same whatever its pace; paced, it is spread over
    more time, so at any moment it takes at most `share` of what it would from the
    database and the service. (nice only orders the processes of its own container: on a
    shared machine the backup's container still takes its share from every other one.)
    The group is always continued before this returns, whatever interrupted it."""
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            if share >= 1:
                process.wait()
            while process.poll() is None:
                time.sleep(PACE_PERIOD * share)
                signal_group(process.pid, signal.SIGSTOP)
                time.sleep(PACE_PERIOD * (1 - share))
                signal_group(process.pid, signal.SIGCONT)
        finally:
            signal_group(process.pid, signal.SIGCONT)
            process.wait()
        out.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), "")


def signal_group(pid: int, signum: int) -> None:
    # A group that has ended has nothing left to stop or continue.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def take_backup(kind: str) -> str | None:
    """Run one backup under the repository's lock; None when it succeeded, else why not."""
    share = pace()
    started = time.monotonic()
    # flock: one backup at a time on the repository, whichever member
    # believes it is the primary (a backup.info written by two at once
    # would be lost). nice, idle I/O class and one process: within the
    # database's container the backup takes what CPU and disk PostgreSQL
    # leaves; the pace (LLMGW_BACKUP_PACE) bounds what it takes from the rest
    # of the machine (docs/operations/backup.md, "The backup's cost").
    done = run_paced(
        ["flock", "-n", str(BACKUP_LOCK), "nice", "-n", "19", "ionice", "-c", "3",
         "pgbackrest", f"--stanza={STANZA}", f"--type={kind}", "--process-max=1", "backup"],
        share,
    )  # fmt: skip
    if done.returncode != 0:
        return f"{kind} backup failed: {last_line(done)}"
    log(f"{kind} backup done in {time.monotonic() - started:.1f} s (pace {share:g})")
    return None


def write_status(
    info: dict[str, Any] | None,
    attempt: tuple[str, str | None] | None,
    problem: str | None = None,
) -> None:
    """One row in backups.status: what the repository holds, the last backup attempt's outcome,
    and (info None) why the repository could not be read."""
    sets = backups(info or {})
    fulls = [b for b in sets if b["type"] == "full"]
    newest = max(sets, key=lambda b: b["timestamp"]["stop"]) if sets else None
    values = {
        "readable": "true" if info is not None else "false",
        "last_backup_at": utc(newest["timestamp"]["stop"]) if newest else "",
        "last_backup_type": newest["type"] if newest else "",
        "last_backup_label": newest["label"] if newest else "",
        "last_full_at": utc(max(b["timestamp"]["stop"] for b in fulls)) if fulls else "",
        "oldest_restorable_at": utc(min(b["timestamp"]["stop"] for b in sets)) if sets else "",
        "backups": str(len(sets)),
        "repository_bytes": str(
            sum((b.get("info") or {}).get("repository", {}).get("delta", 0) for b in sets)
        ),
        "attempted": "true" if attempt else "false",
        "attempt_ok": "true" if attempt and attempt[1] is None else "false",
        "error": (attempt[1] if attempt else None) or problem or "",
        "member": os.environ.get("PATRONI_NAME") or os.uname().nodename,
    }
    global _TABLE_READY
    # The table's DDL once per process (idempotent): the status is the
    # backup machinery's, not the service's schema (docs/operations/backup.md).
    psql(("" if _TABLE_READY else STATUS_SQL.read_text()) + WRITE_STATUS, values)
    _TABLE_READY = True


_TABLE_READY = False


# Empty strings stand for NULL (psql variables are text).
WRITE_STATUS = """
INSERT INTO backups.status AS s (one, checked_at, repository_readable, last_backup_at,
    last_backup_type, last_backup_label, last_full_at, oldest_restorable_at, backups,
    repository_bytes, last_attempt_at, last_attempt_ok, last_error, member)
VALUES (true, now(), :'readable', nullif(:'last_backup_at', '')::timestamptz,
    nullif(:'last_backup_type', ''), nullif(:'last_backup_label', ''),
    nullif(:'last_full_at', '')::timestamptz, nullif(:'oldest_restorable_at', '')::timestamptz,
    :'backups', :'repository_bytes',
    CASE WHEN :'attempted' THEN now() END, CASE WHEN :'attempted' THEN :'attempt_ok'::boolean END,
    nullif(:'error', ''), :'member')
ON CONFLICT (one) DO UPDATE SET
    checked_at = excluded.checked_at,
    repository_readable = excluded.repository_readable,
    -- What the repository holds is kept from the last time it could be read.
    last_backup_at = CASE WHEN excluded.repository_readable THEN excluded.last_backup_at
                          ELSE s.last_backup_at END,
    last_backup_type = CASE WHEN excluded.repository_readable THEN excluded.last_backup_type
                            ELSE s.last_backup_type END,
    last_backup_label = CASE WHEN excluded.repository_readable THEN excluded.last_backup_label
                             ELSE s.last_backup_label END,
    last_full_at = CASE WHEN excluded.repository_readable THEN excluded.last_full_at
                        ELSE s.last_full_at END,
    oldest_restorable_at = CASE WHEN excluded.repository_readable
                                THEN excluded.oldest_restorable_at ELSE s.oldest_restorable_at END,
    backups = CASE WHEN excluded.repository_readable THEN excluded.backups ELSE s.backups END,
    repository_bytes = CASE WHEN excluded.repository_readable THEN excluded.repository_bytes
                            ELSE s.repository_bytes END,
    last_attempt_at = coalesce(excluded.last_attempt_at, s.last_attempt_at),
    last_attempt_ok = coalesce(excluded.last_attempt_ok, s.last_attempt_ok),
    last_error = CASE WHEN excluded.last_attempt_at IS NOT NULL OR NOT excluded.repository_readable
                      THEN excluded.last_error ELSE s.last_error END,
    member = excluded.member;
"""


def ensure_stanza() -> str | None:
    """Create the stanza when the repository has none; None on success, else why not."""
    done = pgbackrest("stanza-create", timeout=300)
    if done.returncode != 0:
        return f"stanza-create failed: {last_line(done)}"
    return None


def one_round() -> None:
    attempt: tuple[str, str | None] | None = None
    try:
        info = repository_info()
        if stanza_missing(info):
            problem = ensure_stanza()
            if problem:
                raise RepositoryError(problem)
            info = repository_info()
        kind = due(info, time.time(), current_timeline())
        if kind is not None:
            attempt = (kind, take_backup(kind))
            info = repository_info()
    except (RepositoryError, subprocess.TimeoutExpired, ValueError, KeyError) as error:
        # The database goes on serving; the status row, the log and the
        # service's metrics say the backups are failing.
        log(f"repository problem: {error}")
        write_status(None, attempt, str(error))
        return
    if attempt and attempt[1]:
        log(attempt[1])
    write_status(info, attempt)


def schedule() -> int:
    every = seconds("LLMGW_BACKUP_CHECK_EVERY", 30)
    log(f"scheduling backups of stanza {STANZA} (a look every {every:g} s)")
    trouble = ""
    while True:
        try:
            if is_primary():
                one_round()
            trouble = ""
        except Exception as error:
            if str(error) != trouble:
                log(f"round failed (retrying every {every:g} s): {error}")
                trouble = str(error)
        time.sleep(every)


# --- restores ----------------------------------------------------------------------------------


def parse_target(text: str) -> float | None:
    """Epoch seconds of an ISO 8601 time (UTC when no offset); None for latest."""
    if text == "latest":
        return None
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


class OutOfRange(Exception):
    pass


def check_target(target: float | None, span: tuple[float, float] | None) -> None:
    if span is None:
        raise OutOfRange("the repository holds no backup: there is nothing to restore")
    oldest, now = span
    if target is not None and not oldest <= target <= now:
        raise OutOfRange(
            f"{utc(target)} is outside the restorable range {utc(oldest)} .. {utc(now)} "
            "(from the end of the oldest backup to now)"
        )


def request_restore(target_text: str) -> int:
    try:
        target = parse_target(target_text)
    except ValueError:
        print(f"target {target_text!r} is neither 'latest' nor an ISO 8601 time", file=sys.stderr)
        return 2
    try:
        span = restorable_range(repository_info())
        check_target(target, span)
    except (RepositoryError, OutOfRange) as error:
        print(f"restore refused: {error}", file=sys.stderr)
        return 2
    assert span is not None
    REQUEST.write_text(json.dumps({"target": utc(target) if target is not None else "latest",
                                   "requested_at": utc(time.time())}))  # fmt: skip
    print(json.dumps({"target": utc(target) if target else "latest",
                      "range": [utc(span[0]), utc(span[1])]}))  # fmt: skip
    return 0


def bootstrap(datadir: str) -> int:
    """Restore the requested target into an empty data directory (recovery, then promote)."""
    if not REQUEST.exists():
        log(f"no restore request at {REQUEST}: nothing to bootstrap from")
        return 1
    target = json.loads(REQUEST.read_text())["target"]
    args = ["--delta", f"--pg1-path={datadir}"]
    if target == "latest":
        args += ["--type=default"]
    else:
        # pgBackRest's (and recovery_target_time's) form: "YYYY-MM-DD HH:MM:SS.ffffff+00".
        when = dt.datetime.fromtimestamp(parse_target(target) or 0, dt.UTC)
        args += [
            "--type=time",
            f"--target={when:%Y-%m-%d %H:%M:%S.%f}+00",
            "--target-action=promote",
        ]
    log(f"restoring {target} into {datadir}")
    done = subprocess.run(["pgbackrest", f"--stanza={STANZA}", *args, "restore"])
    return done.returncode


def history(timeline: int) -> list[tuple[int, int]]:
    """(parent timeline, switch point LSN) for each ancestor of `timeline`, from the archive.

    Read with repo-get (decrypted, no local data directory needed: a replica
    being built has none, and archive-get would want its pg_control).
    """
    if timeline == 1:
        return []
    info = repository_info()
    archive_id = (info.get("archive") or [{}])[-1].get("id")
    name = f"{timeline:08X}.history"
    done = pgbackrest("repo-get", f"archive/{STANZA}/{archive_id}/{name}", timeout=120)
    if done.returncode != 0:
        raise RepositoryError(f"{name} is not in the archive: {last_line(done)}")
    ancestors = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            ancestors.append((int(parts[0]), lsn(parts[1])))
    return ancestors


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def on_history(backup: dict[str, Any], timeline: int, ancestors: list[tuple[int, int]]) -> bool:
    """The backup ends on the leader's timeline, or on an ancestor before it branched off."""
    on = timeline_of(backup)
    if on == timeline:
        return True
    stop = lsn(backup["lsn"]["stop"])
    return any(parent == on and stop <= switch for parent, switch in ancestors)


def leader_timeline(connstring: str) -> int:
    """The leader's timeline, from its Patroni (its host is the one Patroni clones from)."""
    host = dict(p.split("=", 1) for p in connstring.split() if "=" in p).get("host", "")
    with urllib.request.urlopen(f"http://{host}:8008/patroni", timeout=5) as answer:
        return int(json.loads(answer.read())["timeline"])


def replica(datadir: str, connstring: str) -> int:
    try:
        timeline = leader_timeline(connstring)
        ancestors = history(timeline)
        usable = [b for b in backups(repository_info()) if on_history(b, timeline, ancestors)]
    except (RepositoryError, OSError, ValueError, KeyError) as error:
        log(f"replica from the repository: cannot choose a backup ({error}); pg_basebackup next")
        return 1
    if not usable:
        log(f"replica from the repository: no backup on timeline {timeline}'s history; "
            "pg_basebackup next")  # fmt: skip
        return 1
    chosen = max(usable, key=lambda b: b["timestamp"]["stop"])
    log(
        f"replica from backup {chosen['label']} (timeline {timeline_of(chosen)}, leader on {timeline})"
    )
    done = subprocess.run(["pgbackrest", f"--stanza={STANZA}", "--delta", f"--pg1-path={datadir}",
                           f"--set={chosen['label']}", "--type=standby", "restore"])  # fmt: skip
    return done.returncode


def archived_segments(prefixes: set[str]) -> set[str]:
    """The segment names the repository holds under these 16-character prefixes."""
    info = repository_info()
    archive_id = (info.get("archive") or [{}])[-1].get("id")
    if not archive_id:
        return set()
    held = set()
    for prefix in sorted(prefixes):
        done = pgbackrest("repo-ls", f"archive/{STANZA}/{archive_id}/{prefix}", timeout=120)
        if done.returncode != 0:
            raise RepositoryError(last_line(done))
        held.update(name[:24] for name in done.stdout.split())
    return held


def on_role_change(role: str) -> int:
    if role not in ("primary", "master"):
        return 0
    wal = Path(os.environ.get("PGBACKREST_PG1_PATH", "")) / "pg_wal"
    status = wal / "archive_status"
    received = sorted(
        p.name[:24] for p in status.glob("*.done") if len(p.name) == 29 and p.name[:24].isalnum()
    )
    present = [name for name in received if (wal / name).exists()]
    if not present:
        return 0
    try:
        held = archived_segments({name[:16] for name in present})
    except RepositoryError as error:
        log(f"promoted: cannot list the archive ({error}); the previous timeline may have a gap")
        return 1
    missing = [name for name in present if name not in held]
    failed = 0
    for name in missing:
        done = pgbackrest("archive-push", "--no-archive-async", str(wal / name), timeout=300)
        if done.returncode != 0:
            failed += 1
            log(f"promoted: archiving {name} failed: {last_line(done)}")
    log(f"promoted: {len(missing) - failed} segment(s) the old leader had not archived pushed "
        f"({', '.join(missing) or 'none missing'}); {failed} failed")  # fmt: skip
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw-backup", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("schedule")
    commands.add_parser("range")
    commands.add_parser("status")
    request = commands.add_parser("request-restore")
    request.add_argument("target")
    commands.add_parser("clear-request")
    now = commands.add_parser("backup", help="take one backup now, as the schedule does")
    now.add_argument("type", choices=("full", "incr", "diff"))
    role = commands.add_parser("on-role-change")
    role.add_argument("action", nargs="?", default="")
    role.add_argument("role", nargs="?", default="")
    role.add_argument("scope", nargs="?", default="")
    boot = commands.add_parser("bootstrap")
    boot.add_argument("--scope")
    boot.add_argument("--datadir", default=os.environ.get("PGDATA", ""))
    rep = commands.add_parser("replica")
    for option in ("--scope", "--role", "--datadir", "--connstring"):
        rep.add_argument(option, default="")
    # Patroni passes its own options too (--keep_data=True...): tolerated.
    args, _ = parser.parse_known_args(argv)
    if args.command == "schedule":
        return schedule()
    if args.command == "range":
        try:
            span = restorable_range(repository_info())
        except RepositoryError as error:
            print(f"the repository cannot be read: {error}", file=sys.stderr)
            return 1
        print(json.dumps(None if span is None else [utc(span[0]), utc(span[1])]))
        return 0
    if args.command == "status":
        one_round()
        return 0
    if args.command == "request-restore":
        return request_restore(args.target)
    if args.command == "backup":
        problem = take_backup(args.type)
        if problem:
            print(problem, file=sys.stderr)
        return 1 if problem else 0
    if args.command == "clear-request":
        REQUEST.unlink(missing_ok=True)
        return 0
    if args.command == "on-role-change":
        return on_role_change(args.role)
    if args.command == "bootstrap":
        return bootstrap(args.datadir)
    return replica(args.datadir, args.connstring)


if __name__ == "__main__":
    sys.exit(main())
