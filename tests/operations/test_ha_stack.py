"""The highly available deployment (docker-compose.ha.yml) under faults, judged by its history.

Brings the whole stack up as docs/deployment/ha.md says (`docker-compose -f
docker-compose.ha.yml up -d --build`: three etcd, three PostgreSQL members under
Patroni, two HAProxies, two service replicas behind nginx, an agent) and runs
load through nginx while the database's machines fail: two schedulers placing
and releasing replicas (each keeps a few held, retries a refused write as a
scheduler would, honouring Retry-After) and heartbeats. Every attempt is kept
with when it started and ended and what it got, and the history is judged:

- the leader's container SIGKILLed, several times: a new leader, the first
  acknowledged place within the bounds below, the killed member started again
  streaming from the new leader within 60 s, the cluster back to three members
  with a synchronous standby;
- the leader's Patroni frozen (SIGSTOP) for 2 x ttl, then resumed: the new
  leader keeps the lock (Debian's Patroni 3.0.2 let the old one take it back
  and lost acknowledged commits);
- the leader cut off from etcd (`docker network disconnect`): it demotes
  itself, and sampling every member every second never finds two primaries nor
  two writable PostgreSQLs, the old one read-only before the new one is promoted;
- a planned switchover (`patronictl switchover`): not one request refused;

and in every story: no acknowledged write lost (each replica a scheduler holds
is stored with the GPUs it was given, each it released is gone), no GPU held by
two replicas at once, and no answer but success or DATABASE_UNAVAILABLE (no
500, no 502 from nginx, no other error).

Beside them: only nginx is published, no image holds a password, Patroni's
write endpoints refuse a stranger; and with both replicas' replay paused,
staleness-tolerant reads leave them within INVENTORY_READ_MAX_LAG (each read's
staleness judged by the writes it missed) and come back once replay resumes.

Patroni's REST API and PostgreSQL are reached from inside the deployment's
networks (`docker exec`), as nothing but nginx is published.
Needs Docker as tests/operations/test_compose_stack.py does (skipped without it,
failed under LLMGW_REQUIRE_DOCKER=1, as in CI).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from tests.support import REPO
from tests.support.backup_drill import drill, repository_lost
from tests.support.compose_stacks import (
    remove_image_tags,
    require_docker,
    stack_environment,
    wait_for,
)
from tests.support.ha_stack import (
    CLIENT_TIMEOUT,
    COMPOSE_FILE,
    HA_IMAGES,
    IMAGE,
    KILLS,
    MEDIAN_FIRST_PLACE,
    MEMBERS,
    NODES,
    PROJECT,
    REJOIN_WITHIN,
    SECRETS,
    TOKEN,
    TTL,
    WORST_FIRST_PLACE,
    Attempt,
    Gpus,
    HaStack,
    Load,
    judge,
    under_way,
    verdict,
)
from tests.support.reports import REGISTER, node_input

pytestmark = pytest.mark.docker


def test_the_verdict_finds_each_kind_of_wrong_history() -> None:
    """verdict() would fail the stories above (no Docker needed)."""
    a, b = frozenset({("n1", 0)}), frozenset({("n1", 1)})

    def says(wrong: list[str], text: str) -> bool:
        return any(text in w for w in wrong)

    def place(replica: str, at: float, gpus: Gpus, outcome: str = "ok") -> Attempt:
        return Attempt("s", "place", replica, at, at + 0.1, outcome, gpus=gpus)

    def release(replica: str, at: float, freed: int | None, outcome: str = "ok") -> Attempt:
        return Attempt("s", "release", replica, at, at + 0.1, outcome, freed=freed)

    good = [place("r1", 0, a), release("r1", 1, 1), place("r2", 2, a), place("r3", 3, b)]
    holding = {"r2": a, "r3": b}
    assert verdict(good, holding, {"r2": a, "r3": b}) == []
    # An unanswered release, then its retry freeing nothing: fine.
    retried = [*good, release("r2", 4, None, "unavailable"), release("r2", 5, 0)]
    assert verdict(retried, {"r3": b}, {"r3": b}) == []
    assert says(verdict(good, holding, {"r3": b}), "place of r2 lost")
    assert says(verdict(good, holding, {"r2": b, "r3": b}), "place of r2 lost or changed")
    assert says(verdict(good, holding, {"r1": a, "r2": a, "r3": b}), "release of r1 undone")
    lost = [place("r1", 0, a), release("r1", 1, 0), place("r2", 2, a)]
    assert says(verdict(lost, {"r2": a}, {"r2": a}), "r1: place acknowledged, then nothing")
    twice = [place("r1", 0, a), place("r2", 1, a), place("r3", 2, b)]
    assert says(verdict(twice, {"r3": b}, {"r3": b}), "held by r1 and r2 at once")
    nested = [place("r1", 0, a), place("r2", 1, b), release("r2", 2, 1), place("r3", 3, a)]
    assert says(verdict(nested, {"r1": a, "r3": a}, {"r1": a, "r3": a}), "held by r1 and r3")
    failed = [*good, Attempt("s", "heartbeat", "n1", 5, 6, "failed", "HTTP 502")]
    assert says(verdict(failed, holding, {"r2": a, "r3": b}), "heartbeat n1: HTTP 502")


@pytest.fixture(scope="module")
def stack() -> Iterator[HaStack]:
    require_docker("the HA deployment test")
    started = time.monotonic()
    env, port, prefix = stack_environment(IMAGE, TOKEN, LLMGW_HA_IMAGE_PREFIX=HA_IMAGES, **SECRETS)
    stack = HaStack(env, port, prefix)
    stack.compose("down", "-v", "--remove-orphans")
    try:
        # As docs/deployment/ha.md says: built and started in one command.
        stack.compose("up", "-d", "--build", timeout=900)
        built = time.monotonic()
        wait_for(
            "nginx to answer /readyz",
            180,
            lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200,
        )
        stack.wait_settled(120)
        for node in NODES:
            stack.gql(REGISTER, {"input": node_input(node)})
        print(
            f"\nHA stack: images and containers {built - started:.0f} s, "
            f"ready {time.monotonic() - built:.0f} s later"
        )
        yield stack
    except BaseException:
        print(stack.compose("logs", "--no-color", "--tail", "60", timeout=60))
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans", timeout=180)
        remove_image_tags(
            IMAGE,
            f"{HA_IMAGES}/patroni:4.1.5-pg15",
            f"{HA_IMAGES}/etcd:3.4",
            f"{HA_IMAGES}/haproxy:2.6",
        )


def kill_the_leader(stack: HaStack, load: Load) -> dict[str, float]:
    """SIGKILL the leader's container; back to three members. What each step took."""
    members = stack.wait_settled(120)
    old = next(n for n, m in members.items() if m["role"] == "leader")
    under_way(load, time.monotonic())
    stack.docker("kill", stack.container(old))  # SIGKILL to PID 1: Patroni and PostgreSQL
    # From when the container is gone: a place acknowledged while `docker kill`
    # ran was the old leader's.
    killed = time.monotonic()
    new = wait_for("another leader", 90, lambda: stack.leader_other_than(old))
    promoted = time.monotonic()
    first = wait_for(
        "a place acknowledged after the kill",
        90,
        lambda: load.first_place_acked_after(killed),
        every=0.2,
    )
    # Started again only now: a leader back within ttl keeps its lock (patroni #1872).
    starting = time.monotonic()
    stack.docker("start", stack.container(old))

    def streaming_from_new() -> bool:
        m = stack.cluster(avoid=(old,))
        return m.get(old, {}).get("state") == "streaming" and m[old].get("timeline") == m[new].get(
            "timeline"
        )

    wait_for(f"{old} streaming from {new}", REJOIN_WITHIN, streaming_from_new, every=1.0)
    rejoined = time.monotonic()
    stack.wait_settled(60)
    with load.paused():
        judge(stack, load)
    return {
        "first_place": first - killed,
        "leader_seen": promoted - killed,
        "rejoined": rejoined - starting,
    }


def test_the_leader_killed_is_replaced_and_rejoins_losing_nothing(stack: HaStack) -> None:
    with Load(stack.url, "kill") as load:
        figures = [kill_the_leader(stack, load) for _ in range(KILLS)]
    judge(stack, load)
    load.release_all()
    firsts = [f["first_place"] for f in figures]
    seen = ", ".join(f"{f['leader_seen']:.1f}" for f in figures)
    rejoined_after = ", ".join(f"{f['rejoined']:.1f}" for f in figures)
    print(
        f"\nleader SIGKILLed {len(figures)} times: first acknowledged place after "
        f"{', '.join(f'{s:.1f}' for s in firsts)} s (min {min(firsts):.1f}, median "
        f"{statistics.median(firsts):.1f}, max {max(firsts):.1f}); new leader seen after "
        f"{seen} s; killed member streaming {rejoined_after} s after its start; "
        f"{sum(a.outcome == 'unavailable' for a in load.history)} DATABASE_UNAVAILABLE "
        f"answers, {len(load.history)} requests"
    )
    # Each kill was cut short by the witness, not waited out to ttl.
    released = stack.compose("logs", "--no-color", "witness").count("released the leader lock of")
    print(f"the witness released {released} dead leaders' locks")
    assert released == len(figures), released
    assert statistics.median(firsts) <= MEDIAN_FIRST_PLACE, firsts
    assert max(firsts) <= WORST_FIRST_PLACE, firsts


def test_the_leaders_patroni_frozen_for_two_ttls_loses_nothing(stack: HaStack) -> None:
    members = stack.wait_settled(120)
    old = next(n for n, m in members.items() if m["role"] == "leader")
    pid = stack.patroni_pid(old)
    with Load(stack.url, "freeze") as load:
        under_way(load, time.monotonic())
        frozen = time.monotonic()
        # Patroni's daemon only: its PostgreSQL stays up, a primary nobody
        # manages, as when a machine stalls.
        stack.in_member(old, "sh", "-c", f"kill -STOP {pid}")
        try:
            new = wait_for("another leader", 2 * TTL, lambda: stack.leader_other_than(old))
            time.sleep(max(0.0, frozen + 2 * TTL - time.monotonic()))
        finally:
            stack.in_member(old, "sh", "-c", f"kill -CONT {pid}")
        resumed = time.monotonic()
        # The old leader demotes itself; the lock stays with the new one.
        members = stack.wait_settled(120)
        assert members[new]["role"] == "leader", members
        under_way(load, time.monotonic())
        settled = time.monotonic()
    judge(stack, load)
    load.release_all()
    print(
        f"\nleader's Patroni frozen {resumed - frozen:.0f} s: {new} took over; the cluster "
        f"settled {settled - resumed:.0f} s after the resume with {new} still leader; "
        f"{len(load.history)} requests"
    )


SAMPLER = r"""
# Every second, each member: does its Patroni answer /primary with 200, and is
# its PostgreSQL out of recovery (writable)? One JSON line per round; ends when
# its standard input closes.
import json, os, sys, threading, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
import psycopg2

addresses = json.loads(sys.argv[1])
password = os.environ["PATRONI_SUPERUSER_PASSWORD"]
connections = {}
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()

def probe(name):
    address = addresses[name]
    try:
        primary = urllib.request.urlopen(f"http://{address}:8008/primary", timeout=0.8).status
    except urllib.error.HTTPError as error:
        primary = error.code
    except Exception:
        primary = None
    writable = None
    try:
        conn = connections.get(name)
        if conn is None or conn.closed:
            conn = connections[name] = psycopg2.connect(
                host=address, user="postgres", password=password, dbname="postgres",
                connect_timeout=1, options="-c statement_timeout=800")
            conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("SELECT NOT pg_is_in_recovery()")
            writable = cursor.fetchone()[0]
    except Exception:
        connections.pop(name, None)
    return name, primary, writable

with ThreadPoolExecutor(len(addresses)) as pool:
    tick = time.monotonic()
    while True:
        at = time.monotonic()
        rows = list(pool.map(probe, addresses))
        print(json.dumps({"at": at, "primary": {n: p for n, p, _ in rows},
                          "writable": {n: w for n, _, w in rows}}), flush=True)
        tick += 1.0
        time.sleep(max(0.0, tick - time.monotonic()))
"""


class Sampler:
    """SAMPLER run inside a member's container (the db network), its rounds collected here."""

    def __init__(self, stack: HaStack, inside: str) -> None:
        addresses = json.dumps({m: stack.address(m) for m in MEMBERS})
        self.process = subprocess.Popen(
            ["docker", "exec", "-i", stack.container(inside), "python3", "-c", SAMPLER, addresses],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
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
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.reader.join(timeout=10)


def test_the_leader_cut_off_from_etcd_steps_down_before_another_is_promoted(
    stack: HaStack,
) -> None:
    members = stack.wait_settled(120)
    old = next(n for n, m in members.items() if m["role"] == "leader")
    inside = next(n for n in MEMBERS if n != old)
    network = f"{PROJECT}_dcs"
    sampler = Sampler(stack, inside)
    try:
        with Load(stack.url, "cut") as load:
            under_way(load, time.monotonic())
            wait_for("the sampler's rounds", 30, lambda: len(sampler.rounds) >= 3)
            cut = time.monotonic()
            stack.docker("network", "disconnect", network, stack.container(old))
            try:
                new = wait_for("another leader", 90, lambda: stack.leader_other_than(old))
                wait_for(
                    f"{new} sampled as the primary",
                    30,
                    lambda: any(r["at"] > cut and r["primary"][new] == 200 for r in sampler.rounds),
                )
                under_way(load, time.monotonic(), places=5)
            finally:
                stack.docker(
                    "network", "connect", "--ip", stack.dcs_address(old),
                    network, stack.container(old),
                )  # fmt: skip
            healed = time.monotonic()
            stack.wait_settled(120)
            settled = time.monotonic()
            under_way(load, settled, places=5)
    finally:
        sampler.close()
    judge(stack, load)
    load.release_all()
    rounds = sampler.rounds
    print(f"\nrounds after the cut of {old} (seconds: /primary, writable per member):")
    for r in rounds:
        if r["at"] > cut - 2:
            print(
                f"  {r['at'] - cut:6.1f}",
                " ".join(f"{m}:{r['primary'][m]}/{r['writable'][m]}" for m in MEMBERS),
            )
    two_primaries = [r for r in rounds if sum(c == 200 for c in r["primary"].values()) > 1]
    assert not two_primaries, two_primaries[:5]
    two_writable = [r for r in rounds if sum(bool(w) for w in r["writable"].values()) > 1]
    assert not two_writable, two_writable[:5]
    after_cut = [r for r in rounds if r["at"] > cut]
    old_last_writable = max((r["at"] for r in after_cut if r["writable"][old]), default=cut)
    new_first_writable = min(r["at"] for r in after_cut if r["writable"][new])
    new_first_primary = min(r["at"] for r in after_cut if r["primary"][new] == 200)
    # Nothing can be acknowledged from the isolated side once it is read-only,
    # and it was read-only before the new leader took writes.
    assert old_last_writable < new_first_writable, (old_last_writable, new_first_writable)
    print(
        f"\nleader {old} cut off from etcd: read-only {old_last_writable - cut:.1f} s after the "
        f"cut, {new} writable after {new_first_writable - cut:.1f} s and /primary after "
        f"{new_first_primary - cut:.1f} s; {len(rounds)} rounds sampled, never two primaries; "
        f"settled {settled - healed:.0f} s after the network came back"
    )


def test_only_nginx_is_published_and_patronis_write_endpoints_refuse_strangers(
    stack: HaStack,
) -> None:
    # Nothing but the proxy is bound on the host.
    published = {}
    for container in stack.compose("ps", "-q").split():
        name, ports = stack.docker(
            "inspect", "-f", "{{.Name}} {{json .NetworkSettings.Ports}}", container
        ).split(" ", 1)
        bound = {p: b for p, b in (json.loads(ports) or {}).items() if b}
        if bound:
            published[name] = bound
    assert [n.split("_")[1] for n in published] == ["proxy"], published
    # No password is in an image: they come from the environment.
    for image in {stack.docker("inspect", "-f", "{{.Image}}", c).strip()
                  for c in stack.compose("ps", "-q").split()}:  # fmt: skip
        config = stack.docker("image", "inspect", image)
        leaked = [name for name, value in SECRETS.items() if value in config]
        assert not leaked, f"{leaked} in image {image}"
    members = stack.wait_settled(120)
    leader = next(n for n, m in members.items() if m["role"] == "leader")
    standby = next(n for n, m in members.items() if m["role"] == "sync_standby")
    asker = standby
    body = json.dumps({"leader": leader, "candidate": standby})
    for endpoint in ("switchover", "failover", "restart", "reinitialize", "config"):
        method = "PATCH" if endpoint == "config" else "POST"
        target = standby if endpoint == "reinitialize" else leader
        status = stack.in_member(
            asker,
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method,
            "-d", body if endpoint in ("switchover", "failover") else "{}",
            f"http://{stack.address(target)}:8008/{endpoint}",
        )  # fmt: skip
        assert status == "401", f"unauthenticated {method} /{endpoint}: HTTP {status}"
    time.sleep(2)
    after = stack.wait_settled(30)
    assert after[leader]["role"] == "leader", after


def test_a_planned_switchover_under_load_fails_no_request(stack: HaStack) -> None:
    members = stack.wait_settled(120)
    old = next(n for n, m in members.items() if m["role"] == "leader")
    new = next(n for n, m in members.items() if m["role"] == "sync_standby")
    with Load(stack.url, "switch") as load:
        under_way(load, time.monotonic())
        began = time.monotonic()
        # As an operator would (docs/deployment/ha.md), with the REST API's credentials.
        said = stack.in_member(
            old, "patronictl", "switchover", "--leader", old, "--candidate", new, "--force",
            timeout=90,
        )  # fmt: skip
        done = time.monotonic()
        members = stack.wait_settled(60)
        assert members[new]["role"] == "leader", (said, members)
        under_way(load, time.monotonic())
    judge(stack, load)
    load.release_all()
    refused = [a for a in load.history if a.outcome != "ok"]
    print(
        f"\nswitchover {old} -> {new} under load: patronictl took {done - began:.1f} s; "
        f"{len(load.history)} requests, {len(refused)} not answered at once"
    )
    assert not refused, [(a.op, a.replica, a.outcome, a.detail) for a in refused[:10]]


READ_MAX_LAG = float(
    yaml.safe_load((REPO / COMPOSE_FILE).read_text())["x-inventory"]["environment"][
        "INVENTORY_READ_MAX_LAG"
    ]
)
FRESH = "ha-fresh"
READ_FRESH = 'query Fresh { node(id: "ha-fresh") { labels { key value } } }'


@dataclass
class Read:
    started: float
    seq: int
    source: str
    lag: float


class Freshness:
    """A writer re-registering node FRESH with label seq=n (when each n was acknowledged), and a
    reader asking for it through nginx (what each answer said, and where it was read)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: dict[int, float] = {}
        self.reads: list[Read] = []
        self.problems: list[str] = []
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self.writer, daemon=True),
            threading.Thread(target=self.reader, daemon=True),
        ]

    def __enter__(self) -> Freshness:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)

    def writer(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=CLIENT_TIMEOUT, headers=headers) as client:
            n = 0
            while not self.stopping.is_set():
                n += 1
                report = node_input(FRESH, labels=[{"key": "seq", "value": str(n)}])
                body = client.post(
                    self.url, json={"query": REGISTER, "variables": {"input": report}}
                ).json()
                if body.get("errors"):
                    self.problems.append(f"register seq={n}: {body['errors']}")
                    return
                self.acked[n] = time.monotonic()
                time.sleep(0.2)

    def reader(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=CLIENT_TIMEOUT, headers=headers) as client:
            while not self.stopping.is_set():
                started = time.monotonic()
                body = client.post(self.url, json={"query": READ_FRESH}).json()
                node = (body.get("data") or {}).get("node")
                where = (body.get("extensions") or {}).get("readFrom") or {}
                if body.get("errors") or not node or not where:
                    self.problems.append(f"read: {body}")
                else:
                    labels = {kv["key"]: kv["value"] for kv in node["labels"]}
                    self.reads.append(
                        Read(started, int(labels["seq"]), where["source"], where["lagSeconds"])
                    )
                time.sleep(0.1)

    def from_replica_since(self, since: float) -> int:
        return sum(1 for r in self.reads if r.started >= since and r.source == "replica")

    def from_primary_since(self, since: float) -> int:
        return sum(1 for r in self.reads if r.started >= since and r.source == "primary")

    def staleness(self, read: Read) -> float:
        """At least how stale the answer was: since the next seq was acknowledged (0 if none
        was yet). Each seq is acknowledged after it committed, so this never overstates."""
        successor = self.acked.get(read.seq + 1)
        return 0.0 if successor is None else max(0.0, read.started - successor)


def test_reads_leave_replicas_whose_replay_is_paused_and_are_never_staler_than_allowed(
    stack: HaStack,
) -> None:
    members = stack.wait_settled(120)
    replicas = [n for n, m in members.items() if m["role"] != "leader"]
    stack.gql(REGISTER, {"input": node_input(FRESH, labels=[{"key": "seq", "value": "0"}])})
    with Freshness(stack.url) as fresh:
        began = time.monotonic()
        wait_for("reads from a replica", 60, lambda: fresh.from_replica_since(began) >= 10)
        # Both replicas stop applying WAL (they still receive it, and the
        # synchronous standby still acknowledges commits: writes go on).
        # Patroni resumes a paused replay at its next loop unless the cluster
        # is in maintenance mode (patronictl pause).
        stack.in_member(replicas[0], "patronictl", "pause", "--wait")
        for member in replicas:
            stack.in_member(member, "psql", "-U", "postgres", "-qAt", "-c",
                            "SELECT pg_wal_replay_pause()")  # fmt: skip
        paused = time.monotonic()
        try:
            wait_for(
                "reads from the primary",
                30,
                lambda: fresh.from_primary_since(paused + READ_MAX_LAG + 1) >= 20,
            )
        finally:
            resuming = time.monotonic()
            for member in replicas:
                stack.in_member(member, "psql", "-U", "postgres", "-qAt", "-c",
                                "SELECT pg_wal_replay_resume()")  # fmt: skip
            stack.in_member(replicas[0], "patronictl", "resume", "--wait")
        resumed = time.monotonic()
        wait_for("reads from a replica again", 60, lambda: fresh.from_replica_since(resumed) >= 10)
    assert not fresh.problems, fresh.problems[:5]
    reads = fresh.reads
    stalest = max(reads, key=fresh.staleness)
    # Never staler than allowed, by the answer's own account and by the writes'.
    assert max(r.lag for r in reads) <= READ_MAX_LAG, max(r.lag for r in reads)
    assert fresh.staleness(stalest) <= READ_MAX_LAG, stalest
    # While both replicas stood still, from the moment their lag passed the
    # limit (plus a probe's interval), every read came from the primary.
    settled = paused + READ_MAX_LAG + 1.0
    during = [r for r in reads if settled <= r.started < resuming]
    assert during and all(r.source == "primary" for r in during), [
        (round(r.started - paused, 2), r.source, r.lag) for r in during if r.source != "primary"
    ][:10]
    print(
        f"\nreplay paused on {', '.join(replicas)}: {len(reads)} reads "
        f"({sum(r.source == 'replica' for r in reads)} from a replica); the last from a replica "
        f"{max((r.started for r in reads if paused <= r.started < resuming and r.source == 'replica'), default=paused) - paused:.2f} s "
        f"after the pause; stalest answer {fresh.staleness(stalest):.2f} s behind the writes "
        f"(allowed {READ_MAX_LAG:g} s)"
    )


def test_a_restore_to_t_brings_back_exactly_what_was_held_at_t(stack: HaStack) -> None:
    """The restore drill (tests/support/backup_drill.py), last: it replaces the cluster with a restored one."""
    stack.wait_settled(120)
    drill(stack, PROJECT, SECRETS["PATRONI_SUPERUSER_PASSWORD"])


def test_a_repository_that_cannot_be_read_fails_backups_loudly_and_writes_go_on(
    stack: HaStack,
) -> None:
    """After the drill: the backup repository unreadable, then readable again."""
    repository_lost(stack)
