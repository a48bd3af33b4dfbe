"""The restore drill (docs/operations/backup.md) on the HA deployment, under load, judged by its history.

Run by tests/operations/test_ha_stack.py as its last story, on its stack
(docker-compose.ha.yml brought up as docs/deployment/ha.md says, its backups
as docs/operations/backup.md says: one stack for both keeps CI short); through nginx, two schedulers placing and
releasing and heartbeats for four nodes (tests/operations/test_ha_stack.py's
Load). Then, as an operator's month would go:

1. the first full backup lands (the schedule takes one at start);
2. the leader is SIGKILLed while WAL is being archived (a WAL switch just
   before): the member promoted in its place archives what the old one had not,
   so the archive has no gap, and the restore below, to a time after the kill,
   must replay across it;
3. time T is recorded with the load paused: what the schedulers hold then (every
   place acknowledged and not released) is the inventory at T;
4. the load goes on (places and releases after T), then the mistake: every node
   of one label value (rack=b) removed;
5. `deploy/restore.sh --to T` while the old cluster still runs, sampled every
   second from a container on the database network: never two members answer
   /primary 200 nor two PostgreSQLs take writes, and no member on the old
   timeline takes writes once one on the new timeline does;
6. verified: what is stored is exactly what was held at T, each replica with its
   GPUs (RPO: acknowledged work before T lost, must be 0; nothing placed after T
   is there, every release after T is undone), the removed nodes are back, the
   three members stream on the new timeline, the events say `restored` to T,
   the service answers, and the nodes' next reports make them READY.

RPO and the restore time are printed.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from tests.support import REPO
from tests.support.compose_stacks import run, wait_for
from tests.support.ha_stack import RELEASE, HaStack, Load, judge, under_way
from tests.support.reports import PLACE, REGISTER, node_input

MEMBERS = ("pg-1", "pg-2", "pg-3")
NODES = [f"ha-node-{i}" for i in range(1, 5)]  # test_ha_stack.py's, heartbeated by its Load
RACK = {node: ("a" if i < 2 else "b") for i, node in enumerate(NODES)}
NODE_STATES = "query { nodes(first: 100) { id state labels { key value } } }"
REMOVE = "mutation Remove($id: ID!) { removeNode(id: $id) }"
RESTORED = 'query { events(kinds: ["restored"]) { kind actor reason detail } }'


def readyz(stack: HaStack) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"http://127.0.0.1:{stack.port}/readyz", timeout=5).json()
    return answer


def timelines(stack: HaStack) -> dict[str, int]:
    return {name: int(m.get("timeline") or 0) for name, m in stack.cluster().items()}


# Every second, each member: /primary's status, writable, and its timeline; from a
# container of the members' image on the db network (the members themselves are
# replaced by the restore).
SAMPLER = r"""
import json, os, sys, threading, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
import psycopg2

addresses = json.loads(sys.argv[1])
password = os.environ["PATRONI_SUPERUSER_PASSWORD"]
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()

def probe(name):
    address = addresses[name]
    try:
        primary = urllib.request.urlopen(f"http://{address}:8008/primary", timeout=0.8).status
    except urllib.error.HTTPError as error:
        primary = error.code
    except Exception:
        primary = None
    writable = timeline = None
    try:
        conn = psycopg2.connect(host=address, user="postgres", password=password, dbname="postgres",
                                connect_timeout=1, options="-c statement_timeout=800")
        conn.autocommit = True
        with conn.cursor() as cursor:
            # The timeline WAL is written on (a primary's); pg_control's lags a promotion.
            cursor.execute("SELECT NOT pg_is_in_recovery(), CASE WHEN NOT pg_is_in_recovery() THEN "
                           "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END")
            writable, timeline = cursor.fetchone()
        conn.close()
    except Exception:
        pass
    return name, primary, writable, timeline

with ThreadPoolExecutor(len(addresses)) as pool:
    tick = time.monotonic()
    while True:
        at = time.time()
        rows = list(pool.map(probe, addresses))
        print(json.dumps({"at": at, "primary": {n: p for n, p, _, _ in rows},
                          "writable": {n: w for n, _, w, _ in rows},
                          "timeline": {n: t for n, _, _, t in rows}}), flush=True)
        tick += 1.0
        time.sleep(max(0.0, tick - time.monotonic()))
"""


class Sampler:
    def __init__(self, stack: HaStack, project: str, password: str) -> None:
        image = stack.docker("inspect", "-f", "{{.Config.Image}}", stack.container("pg-1")).strip()
        addresses = json.dumps({m: stack.address(m) for m in MEMBERS})
        self.process = subprocess.Popen(
            ["docker", "run", "--rm", "-i", "--network", f"{project}_db",
             "-e", f"PATRONI_SUPERUSER_PASSWORD={password}",
             "--entrypoint", "python3", image, "-c", SAMPLER, addresses],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.rounds: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.rounds.append(json.loads(line))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.reader.join(timeout=10)


def first_backup(stack: HaStack) -> str:
    backup = readyz(stack).get("backup") or {}
    return str(backup.get("lastBackupAt") or "")


def kill_the_leader_while_archiving(stack: HaStack, load: Load) -> tuple[str, str]:
    members = stack.wait_settled(120)
    old = next(n for n, m in members.items() if m["role"] == "leader")
    under_way(load, time.monotonic(), places=5)
    # A segment just completed: its archiving is under way when the leader dies.
    stack.in_member(old, "psql", "-U", "postgres", "-qAt", "-c", "SELECT pg_switch_wal()")
    stack.docker("kill", stack.container(old))
    new = wait_for("another leader", 90, lambda: stack.leader_other_than(old))
    stack.docker("start", stack.container(old))
    stack.wait_settled(120)
    under_way(load, time.monotonic(), places=5)
    return old, new


def drill(stack: HaStack, project: str, password: str) -> None:
    """The drill on a settled HA stack (compose project `project`, superuser `password`).

    The stack, its load, its judge and its token are tests/support/ha_stack.py's, the one
    module test_ha_stack.py imports too (so the same random secrets).
    """

    for node in NODES:
        labels = [{"key": "rack", "value": RACK[node]}]
        stack.gql(REGISTER, {"input": node_input(node, labels=labels)})
    wait_for("the first full backup", 240, lambda: first_backup(stack), every=2.0)
    with Load(stack.url, "drill") as load:
        killed, promoted = kill_the_leader_while_archiving(stack, load)
        with load.paused():
            judge(stack, load)  # the history so far is sound
            time.sleep(0.3)  # commits before T end before it, by the servers' clock
            t = datetime.now(UTC)
            with load.lock:
                at_t: dict[str, frozenset[tuple[str, int]]] = {
                    r: g for held in load.holding.values() for r, g in held
                }
            time.sleep(0.3)
        # After T: places and releases that the restore must undo.
        under_way(load, time.monotonic(), places=10)
    timeline_before = max(timelines(stack).values())
    # The mistake: every node of rack b removed.
    removed = [n for n in NODES if RACK[n] == "b"]
    for node in removed:
        assert stack.gql(REMOVE, {"id": node})["removeNode"] is True
    after_mistake = stack.held()
    assert all(node not in {g[0] for gs in after_mistake.values() for g in gs} for node in removed)

    # A target outside the restorable range is refused, naming the range, and changes nothing.
    for outside in ("2000-01-01T00:00:00+00:00", "2999-01-01T00:00:00+00:00"):
        refused = subprocess.run(
            ["bash", "deploy/restore.sh", "-p", project, "--to", outside],
            cwd=REPO, env=stack.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert f"{outside} is outside the restorable range " in refused.stderr, refused.stderr
    assert stack.held() == after_mistake

    sampler = Sampler(stack, project, password)
    try:
        wait_for("the sampler's rounds", 30, lambda: len(sampler.rounds) >= 2)
        began = time.monotonic()
        said = run(
            "bash", "deploy/restore.sh", "-p", project, "--to", t.isoformat(),
            env=stack.env, timeout=1200,
        )  # fmt: skip
        restore_seconds = time.monotonic() - began
        stack.ids.clear()  # the members are new containers
        time.sleep(2)
    finally:
        sampler.close()
    print(said)

    # Never two primaries, never two writable, and the old timeline never writable
    # once the new one was.
    rounds = sampler.rounds
    assert not [r for r in rounds if sum(c == 200 for c in r["primary"].values()) > 1]
    assert not [r for r in rounds if sum(bool(w) for w in r["writable"].values()) > 1]
    new_first = min(
        (r["at"] for r in rounds for m in MEMBERS
         if r["writable"][m] and (r["timeline"][m] or 0) > timeline_before),
        default=None,
    )  # fmt: skip
    assert new_first is not None, rounds[-5:]
    old_late = [
        r for r in rounds if r["at"] >= new_first for m in MEMBERS
        if r["writable"][m] and (r["timeline"][m] or 0) <= timeline_before
    ]  # fmt: skip
    assert not old_late, old_late[:3]

    # Exactly what was held at T: nothing lost before T, nothing kept from after it.
    stored = wait_for("the restored inventory to answer", 120, stack.held)
    lost = {r: g for r, g in at_t.items() if stored.get(r) != g}
    extra = sorted(set(stored) - set(at_t))
    assert not lost, f"RPO: acknowledged before T, lost or changed: {lost}"
    assert not extra, f"placed after T, still there: {extra}"
    # The removed nodes are back; the three members stream on one new timeline.
    members = stack.wait_settled(180)
    on = {m["timeline"] for m in members.values()}
    assert len(on) == 1 and on.pop() > timeline_before, members
    events = stack.gql(RESTORED)["events"]
    assert [e["detail"]["target"] for e in events] == [t.isoformat()], events
    # The nodes' next reports (their agents, here this test for the four nodes, and
    # the demo agent for its own) bring them back READY.
    for node in NODES:
        labels = [{"key": "rack", "value": RACK[node]}]
        stack.gql(REGISTER, {"input": node_input(node, labels=labels)})

    def all_ready() -> bool:
        states = {n["id"]: n["state"] for n in stack.gql(NODE_STATES)["nodes"]}
        return all(states.get(n) == "READY" for n in [*NODES, "demo-node-1"])

    wait_for("every node READY after its next report", 180, all_ready, every=2.0)
    backup = readyz(stack)["backup"]
    print(
        f"\nrestore drill: T = {t.isoformat()}; leader {killed} SIGKILLed while archiving "
        f"before T ({promoted} promoted); restored across that failover to timeline "
        f"{max(timelines(stack).values())} (was {timeline_before}) in {restore_seconds:.0f} s "
        f"(deploy/restore.sh, {len(NODES) + 1} nodes, {len(at_t)} replicas held at T); RPO: "
        f"0 of {len(at_t)} acknowledged replicas lost; {len(sampler.rounds)} sampled rounds, "
        f"never two primaries; backups after: last {backup.get('lastBackupAt')}, "
        f"problems {backup.get('problems')}"
    )


def repository_lost(stack: HaStack) -> None:
    """The repository unreadable (as a full, cut or corrupt one is): backups fail loudly, writes go on."""
    members = stack.wait_settled(120)
    leader = next(n for n, m in members.items() if m["role"] == "leader")
    stack.in_member(leader, "chmod", "000", "/var/lib/pgbackrest")
    try:
        stack.in_member(leader, "psql", "-U", "postgres", "-qAt", "-c", "SELECT pg_switch_wal()")

        def named() -> list[str]:
            problems: list[str] = (readyz(stack).get("backup") or {}).get("problems") or []
            return (
                problems
                if any("cannot be read" in p for p in problems)
                and any(p.startswith("archiving WAL fails") for p in problems)
                else []
            )

        problems = wait_for("the backup problems in /readyz", 120, named, every=2.0)
        assert httpx.get(f"http://127.0.0.1:{stack.port}/readyz", timeout=5).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{stack.port}/metrics", timeout=5).text
        assert "inventory_backup_archive_failing 1" in metrics
        assert "inventory_backup_repository_readable 0" in metrics
        # The database keeps serving.
        placed = stack.gql(PLACE, {"input": {"replicaId": "while-lost", "gpuClass": "H100-80GB",
                                             "gpusPerShard": 1}})["place"]  # fmt: skip
        assert placed["__typename"] == "Allocated", placed
        assert stack.gql(RELEASE, {"id": "while-lost"})["releaseReplica"] == 1
        logs = stack.compose("logs", "--no-color", "inventory-1", "inventory-2")
        assert "WAL archiving fails" in logs
    finally:
        stack.in_member(leader, "chmod", "700", "/var/lib/pgbackrest")

    def recovered() -> bool:
        stack.in_member(leader, "psql", "-U", "postgres", "-qAt", "-c", "SELECT pg_switch_wal()")
        backup = readyz(stack).get("backup") or {}
        return bool(backup.get("ok"))

    wait_for("backups working again", 180, recovered, every=5.0)
    print(f"\nrepository unreadable: /readyz 200 naming {problems}; writes went on; recovered")
