"""Preemption: the victims a place stops to make room, chosen and freed in the transaction that claims.

With `preemption: LOWER_PRIORITY`, a place that finds no room on free GPUs
(and is within its tenant's limit: preemption makes room, not quota) looks
for victims (tenancy/victims.py says which replicas may be, and the order of
victim sets). How:

1. The candidates: whole replicas (every shard, maybe on several nodes)
   that hold GPUs of the class and may be victims (victims.kind_of), read
   with the budgets of their deployments and their tenants' standing.
2. The search: victim sets in victims.set_key order, smallest first, each
   pruned by counting (the GPUs it frees plus what is free on its nodes
   must hold the shape's shards: a necessary condition) and then tried:
   in a savepoint, the set's shards are deleted and the pools recounted,
   and place's own planner (statements.plan_now, what explain() plans
   with) says whether the shape fits; the savepoint is rolled back. So a
   set "fits" by every rule place keeps (NVLink groups, fabrics, rails,
   domains, weights, taints, freshness), by the same code. The first set
   that fits is the one chosen. For a shape of one shard, a minimal set
   frees GPUs on the one node the shard goes to (a victim elsewhere could
   be left out, a smaller set), so sets are drawn per node from the
   victims there; for several shards, from the best MAX_POOL candidates
   by their own key, which is every one on a small cluster. At most
   SEARCH_BOUND sets are tried and MAX_SETS drawn per size: past either,
   the search stops, says so in the answer and counts it (SEARCH_CUT);
   past MAX_SETS the sets of that size tried are the first drawn, in order
   among themselves. For one shard, the sets of one victim come first from
   windows read in their order (_SINGLES, walking ix_shards_victim_order;
   choose() says why).
   A trial takes the claim's locks in the claim's order (the victims'
   nodes, their tenants' quota rows, then the shards): without them a trial
   and a claim stopping the same victim deadlocked. place() does not try
   the first set it draws: it claims it (preempt(); _Trials says why).
3. The claim (preempt_and_claim), in a savepoint of place()'s transaction:
   the victims' nodes locked (waiting: nothing else is held), then their
   budget rows and every tenant's quota row involved (tenancy/
   budgets_locked.py: the lock order), the victims re-read in the statement
   that locks the quota rows (a replica whose shards changed is not
   stopped), and their budgets and
   reclaims re-checked under the locks; each victim freed by the release
   path (allocations.preempt_replica: pools recounted, `released` events
   naming the preemptor, the quota counters kept by their triggers), a
   `replica_preempted` event per victim, and the replica claimed by
   place's own claim (its quota check included) without waiting for a
   lock: a node another transaction holds rolls the savepoint back, and
   place() waits for it with nothing held, then searches again.

explain() runs the same search on the same data without the claim, so the
set it shows is the one place would stop. placeGroup runs it too, the group
standing in as one replica of all its GPUs and each set tried with the
group's own planner (groups/placing.py). Its trials write in savepoints
that are rolled back: explainPlacement with LOWER_PRIORITY runs on the
primary, in a transaction that commits nothing of them.

Fencing (service/fleet/fencing.py) tells each victim's engines to stop at
their node's next contact: their shards are no longer held, and their
`released` event names the preemptor (StopReason PREEMPTED, preemptedBy).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text

from service.database.connections import Connection, keep_until_commit
from service.database.transactions import MAX_ATTEMPTS, TransactionConflict, sqlstate
from service.event_log.events import record_event
from service.scheduling.allocations import Allocated, lock_nodes, preempt_replica
from service.scheduling.availability import pool_offers, pool_withholds
from service.scheduling.gpu_pools import refresh_pools
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement.plan import Plan
from service.scheduling.placement.statements import plan_now
from service.scheduling.tenancy.budgets import BudgetRecord
from service.scheduling.tenancy.budgets_locked import (
    BEYOND,
    LOCK_QUOTAS_SQL,
    budget_lines,
    held_beyond_guarantee,
)
from service.scheduling.tenancy.headroom import Headroom, headroom
from service.scheduling.tenancy.victims import (
    BudgetLine,
    Candidate,
    Preemption,
    PreemptionKind,
    allowed,
    budgets_broken,
    kind_of,
    reclaim_fits,
    reclaiming,
    record_of,
    set_key,
)

# Victim sets tried against the fleet (a savepoint each) per search.
SEARCH_BOUND = 64
# Victim sets drawn per size before they are sorted and tried.
MAX_SETS = 20_000
# For a shape of several shards: the candidates sets are drawn from, the best
# by their own key.
MAX_POOL = 16
# For a shape of one shard: the windows of single victims read in turn before
# every candidate is (choose()); the first set of one nearly always makes
# room, and each shard a window reads costs a lookup or two.
WINDOWS = (8, SEARCH_BOUND)

ACTOR = "preemption"

# explain()'s trials (see trial): the longest wait for a row a claim holds,
# then the trial gives up what it holds; below PostgreSQL's deadlock_timeout
# (1 s), so a cycle with a place is always broken by the trial, never the
# place. And the most a retry then waits, at random, for that claim to end.
EXPLAIN_LOCK_WAIT = "50ms"
EXPLAIN_BACKOFF = 0.02
LOCK_NOT_AVAILABLE = "55P03"
_WAIT_AT_MOST = text("SELECT set_config('lock_timeout', :wait, true)")

log = logging.getLogger(__name__)


class _Cuts:
    """A count of this process's searches (for /metrics): SEARCH_CUT, EXPLAIN_RETRIES."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


SEARCH_CUT = _Cuts()


# The replicas that may be victims of a place at :priority by :tenant: of
# lower priority, or, when :reclaiming, of another tenant.
_ELIGIBLE = "s.priority < :priority OR (CAST(:reclaiming AS boolean) AND s.tenant <> :tenant)"
# Each shard of a replica `s` as the search reads it: the GPUs of class :cls it
# holds (ix_allocated_gpus_shard_id), what its node offers of the class now,
# at most (free and withheld: a toleration may add the latter), the counting
# bound of a set, and what its tenant holds of the class beyond its guarantee
# (budgets_locked.BEYOND; NULL: no quota of the class).
_SHARD_COLUMNS = f"""
    s.replica_id, s.shard_id, s.fence, s.node_id, s.tenant, s.priority, s.deployment,
    s.created_at, cardinality(s.gpu_indices) AS gpus,
    (SELECT count(*) FROM allocated_gpus a
     WHERE a.shard_id = s.shard_id AND a.gpu_class = :cls) AS class_gpus,
    coalesce((SELECT p.free + p.withheld FROM gpu_pools p
              WHERE p.node_id = s.node_id AND p.gpu_class = :cls), 0) AS room,
    (SELECT {BEYOND} FROM tenant_quotas q
     WHERE q.tenant = s.tenant AND q.gpu_class = :cls) AS beyond"""
# Every shard of every replica that may be a victim.
_CANDIDATE_SHARDS = text(
    f"SELECT {_SHARD_COLUMNS} FROM shards s WHERE {_ELIGIBLE} ORDER BY s.replica_id, s.shard_id"
)


def _singles_sql(eligible: str) -> str:
    """_SINGLES with the victims' rule `eligible` over a shard `s` (see below)."""
    return f"""
    WITH most AS MATERIALIZED (
        -- The most any schedulable node of the class offers now (free and
        -- withheld: a toleration may add the latter), from the partial
        -- indexes of the pools that offer some (ix_gpu_pools_fit and
        -- ix_gpu_pools_withheld_class): a replica alone on a node makes room
        -- there only when it holds at least :per less than that.
        SELECT greatest(
            (SELECT max(p.free + p.withheld) FROM gpu_pools p
             WHERE p.gpu_class = :cls AND {pool_offers("p")}),
            (SELECT max(p.withheld) FROM gpu_pools p
             WHERE p.gpu_class = :cls AND {pool_withholds("p")}),
            0) AS room
    ), walked AS MATERIALIZED (
        -- Shards in the order of sets of one (ix_shards_victim_order), each
        -- one that alone would make room on its node with what the node
        -- offers: the first :window of them.
        SELECT s.replica_id, s.priority, cardinality(s.gpu_indices) AS gpus, s.created_at
        FROM shards s
        WHERE ({eligible})
          AND cardinality(s.gpu_indices) >= :per - (SELECT m.room FROM most m)
          AND EXISTS (SELECT 1 FROM gpu_pools p
                      WHERE p.node_id = s.node_id AND p.gpu_class = :cls AND p.schedulable
                        AND p.free + p.withheld + cardinality(s.gpu_indices) >= :per)
        ORDER BY s.priority, cardinality(s.gpu_indices), s.created_at DESC,
                 s.replica_id COLLATE "C"
        LIMIT :window
    ), crowded AS MATERIALIZED (
        -- Replicas with several shards on one node, which together may make
        -- room there where none alone does (the walk looks at shards one by
        -- one): the shards marked crowded (ix_shards_crowded, migration
        -- 0026p), by node.
        SELECT s.replica_id FROM shards s
        WHERE s.crowded AND ({eligible})
        GROUP BY s.replica_id, s.node_id
        HAVING count(*) > 1
           AND EXISTS (SELECT 1 FROM gpu_pools p
                       WHERE p.node_id = s.node_id AND p.gpu_class = :cls AND p.schedulable
                         AND p.free + p.withheld + sum(cardinality(s.gpu_indices)) >= :per)
    ), last AS (
        SELECT * FROM walked w
        ORDER BY w.priority DESC, w.gpus DESC, w.created_at, w.replica_id COLLATE "C" DESC
        LIMIT 1
    ), r AS (
        -- The replicas found, each with its key as a set of one. A replica's
        -- key is never before any of its shards' (its priority the least of
        -- theirs, its GPUs their sum, its creation the oldest), so when the
        -- walk stopped at :window shards, every replica up to the last
        -- shard walked was found (one alone on a node by the walk, a crowded
        -- one by `crowded`), and those past it may not be the next ones.
        -- (An aggregate per replica, so each reads its own shards by
        -- ix_shards_replica_id.)
        SELECT f.replica_id, a.priority, a.gpus, a.created_at
        FROM (SELECT w.replica_id FROM walked w UNION SELECT c.replica_id FROM crowded c) f
        CROSS JOIN LATERAL (
            SELECT min(x.priority) AS priority, sum(cardinality(x.gpu_indices)) AS gpus,
                   min(x.created_at) AS created_at
            FROM shards x WHERE x.replica_id = f.replica_id) a
    ), useful AS MATERIALIZED (
        SELECT r.replica_id, row_number() OVER (
                   ORDER BY r.priority, r.gpus, r.created_at DESC, r.replica_id COLLATE "C") AS k
        FROM r LEFT JOIN last l ON (SELECT count(*) FROM walked) >= :window
        WHERE l.replica_id IS NULL
           OR r.priority < l.priority
           OR (r.priority = l.priority AND (r.gpus < l.gpus
               OR (r.gpus = l.gpus AND (r.created_at > l.created_at
                   OR (r.created_at = l.created_at
                       AND r.replica_id COLLATE "C" <= l.replica_id COLLATE "C")))))
        ORDER BY k LIMIT :window
    )
    SELECT {_SHARD_COLUMNS}, u.k, (SELECT count(*) >= :window FROM walked) AS cut
    FROM useful u JOIN LATERAL (
        -- OFFSET 0: not flattened into a join that reads every shard.
        SELECT * FROM shards x WHERE x.replica_id = u.replica_id OFFSET 0) s ON true
    ORDER BY u.k, s.shard_id
    """


# For a shape of one shard: every shard of the first :window replicas that
# may be victims, in the order of sets of one (victims.set_key: priority,
# GPUs, youngest, id; "C" so ids compare as Python compares them), among
# those that could make room on a node of the class alone with what the node
# offers (counted per shard, and per node for a replica of several shards
# on one). Read from ix_shards_victim_order: as many entries as the window
# uses, however large the fleet (the index range starts at the GPUs a
# replica must hold to make room on the roomiest node). A node that is not
# schedulable takes no replica, so one made room on only there is none.
# The search counts them exactly (_may_fit) and tries them in this order, so
# the window only bounds how many are read. Reclaiming, a victim may be of
# any priority (another tenant's): the walk then goes through the index's
# every priority, the shards of the placing tenant's own left out.
_SINGLES = text(_singles_sql("s.priority < :priority"))
_SINGLES_RECLAIMING = text(_singles_sql(_ELIGIBLE))
_SHARDS_ROOM = text(
    """
    SELECT coalesce(sum((p.free + p.withheld) / :per), 0) AS shards FROM gpu_pools p
    WHERE p.gpu_class = :cls
    """
)
# The tenants' quota rows locked (budgets_locked: the lock order, and what
# each holds beyond its guarantee as locked), and the victims' shards as they
# are now: one statement, started once the victims' nodes were locked, so
# its snapshot sees every change to their shards (each is made under a
# node's lock) whatever the quota locks wait for.
_LOCK_QUOTAS_READ_SHARDS = text(
    f"""
    WITH quotas AS MATERIALIZED ({LOCK_QUOTAS_SQL})
    SELECT q.tenant, q.beyond, CAST(NULL AS text) AS replica_id, CAST(NULL AS text) AS shard_id,
           CAST(NULL AS integer) AS fence
    FROM quotas q
    UNION ALL
    SELECT NULL, NULL, s.replica_id, s.shard_id, s.fence FROM shards s
    WHERE s.replica_id = ANY(CAST(:ids AS text[]))
    ORDER BY 1, 3, 4
    """
)
# A trial: the set's shards gone (their allocated_gpus by the cascade), in a
# savepoint that is always rolled back.
_FORGET = text("DELETE FROM shards WHERE replica_id = ANY(CAST(:ids AS text[])) RETURNING node_id")


@dataclass(frozen=True)
class Standing:
    """What a search knows of the fleet for one place: the candidates and the rules' numbers."""

    candidates: tuple[Candidate, ...]
    budgets: Mapping[tuple[str, str], BudgetLine]
    # Per tenant with a quota of the class: GPUs held beyond its guarantee.
    beyond: Mapping[str, int]
    # Per node a candidate holds GPUs of the class on: what it offers now.
    rooms: Mapping[str, int]
    # Shards of the shape the fleet's free GPUs hold now (several shards only).
    free_shards: int
    # When set, what counting says of a set instead of _may_fit (a group of
    # several GPU classes: each class's GPUs freed plus free hold what it asks).
    may_fit: Callable[[Sequence[Candidate]], bool] | None = None


@dataclass(frozen=True)
class Choice:
    """The victim set chosen, and where the replica would go once they are stopped."""

    victims: tuple[Candidate, ...]
    # Where it would go: a Plan for place(), the group's plan for placeGroup
    # (whatever the search's planner answers).
    plan: Any

    def records(self, request: PlaceRequest) -> tuple[Preemption, ...]:
        return tuple(record_of(v, request.replica_id, request.gpu_class) for v in self.victims)


@dataclass(frozen=True)
class NoChoice:
    """No victim set makes room: why, and the budgets that kept one that would have."""

    why: str
    blocking: tuple[BudgetRecord, ...] = ()


async def standing(
    conn: Connection,
    request: PlaceRequest,
    window: int | None = None,
    mine: Headroom | None = None,
) -> tuple[Standing, bool]:
    """The candidates of this place and what the rules need of the fleet, on committed data.

    `window` (a shape of one shard): only the first `window` candidates that
    could make room alone, in the order of sets of one (_SINGLES). Answers
    whether the window cut the list (more candidates may follow). `mine`: the placing tenant's Headroom
    of the class, when the caller read it in this transaction already.
    """
    charge = request.charge
    if mine is None:
        mine = (await headroom(conn, charge.tenant_id, [request.gpu_class]))[request.gpu_class]
    takes_back = reclaiming(mine.used, request.gpus, mine.guaranteed)
    params = {
        "cls": request.gpu_class,
        "priority": charge.priority,
        "tenant": charge.tenant_id,
        "reclaiming": takes_back,
    }
    if window is None:
        rows = list(await conn.execute(_CANDIDATE_SHARDS, params))
    else:
        singles = {**params, "per": request.gpus_per_shard, "window": window}
        statement = _SINGLES_RECLAIMING if takes_back else _SINGLES
        rows = list(await conn.execute(statement, singles))
    by_replica: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by_replica[r.replica_id].append(r)
    # Per tenant with a quota of the class (held_beyond_guarantee's answer).
    beyond = {r.tenant: r.beyond for r in rows if r.beyond is not None}
    candidates: list[Candidate] = []
    rooms: dict[str, int] = {}
    for replica_id, shards in by_replica.items():
        head = shards[0]
        kind = kind_of(
            head.tenant,
            head.priority,
            charge.tenant_id,
            charge.priority,
            takes_back,
            beyond.get(head.tenant, 1) > 0,
        )
        per_node: dict[str, int] = defaultdict(int)
        for s in shards:
            rooms[s.node_id] = s.room
            if s.class_gpus:
                per_node[s.node_id] += s.class_gpus
        if kind is None or not per_node:
            continue
        candidates.append(
            Candidate(
                replica_id,
                head.tenant,
                head.priority,
                head.deployment,
                min(s.created_at for s in shards),
                sum(s.gpus for s in shards),
                tuple(sorted(per_node.items())),
                tuple((s.shard_id, s.fence) for s in shards),
                tuple(sorted({s.node_id for s in shards})),
                kind,
            )
        )
    budgets = await budget_lines(
        conn, {(c.tenant, c.deployment) for c in candidates if c.deployment is not None}
    )
    free_shards = await shards_room(conn, request) if request.shards > 1 else 0
    # Whether the window left out shards the walk did not reach.
    cut = window is not None and any(r.cut for r in rows[:1])
    return Standing(tuple(candidates), budgets, beyond, rooms, free_shards), cut


async def shards_room(conn: Connection, request: PlaceRequest) -> int:
    """Shards of the request's shape the free (and withheld) GPUs of its class hold now, by count."""
    params = {"cls": request.gpu_class, "per": request.gpus_per_shard}
    return int((await conn.execute(_SHARDS_ROOM, params)).scalar_one())


def _may_fit(request: PlaceRequest, state: Standing, victims: Sequence[Candidate]) -> bool:
    """Whether counting alone leaves the set a chance: the GPUs it frees and the free ones hold the shards."""
    freed: dict[str, int] = defaultdict(int)
    for v in victims:
        for node_id, n in v.class_gpus:
            freed[node_id] += n
    per = request.gpus_per_shard
    if request.shards == 1:
        return any(state.rooms.get(n, 0) + k >= per for n, k in freed.items())
    more = sum(
        (state.rooms.get(n, 0) + k) // per - state.rooms.get(n, 0) // per for n, k in freed.items()
    )
    return state.free_shards + more >= request.shards


def _pools(request: PlaceRequest, candidates: Sequence[Candidate]) -> list[list[Candidate]]:
    """The groups victim sets are drawn from (see the module's docstring), each by its own key."""
    ordered = sorted(candidates, key=lambda c: set_key([c]))
    if request.shards > 1:
        return [ordered[:MAX_POOL]]
    on: dict[str, list[Candidate]] = defaultdict(list)
    for c in ordered:
        for node_id, _ in c.class_gpus:
            on[node_id].append(c)
    return [on[n] for n in sorted(on)]


def _sets(
    request: PlaceRequest, state: Standing, keep_budgets: bool, largest: int | None = None
) -> Iterator[tuple[Candidate, ...] | None]:
    """Victim sets in set_key order, those counting rules out left out; None: MAX_SETS reached.

    `largest`: no sets of more victims than this.
    """
    pools = _pools(request, state.candidates)

    def may_fit(combo: Sequence[Candidate]) -> bool:
        if state.may_fit is not None:
            return state.may_fit(combo)
        return _may_fit(request, state, combo)

    most = max((len(p) for p in pools), default=0)
    for size in range(1, min(most, largest or most) + 1):
        drawn: dict[tuple[str, ...], tuple[Candidate, ...]] = {}
        cut = False
        for pool in pools:
            for combo in itertools.combinations(pool, size):
                ids = tuple(sorted(c.replica_id for c in combo))
                if ids in drawn:
                    continue
                if len(drawn) >= MAX_SETS:
                    cut = True
                    break
                if keep_budgets:
                    if not allowed(combo, state.budgets, state.beyond):
                        continue
                elif not reclaim_fits(combo, state.beyond):
                    continue
                if may_fit(combo):
                    drawn[ids] = combo
            if cut:
                break
        yield from sorted(drawn.values(), key=set_key)
        if cut:
            yield None
            return


# What a trial asks once its victims' shards are gone: where the replica (or
# the group) would go, None when it would not fit.
Planner = Callable[[Connection], Awaitable[Any]]


async def _place_plan(conn: Connection, request: PlaceRequest) -> Plan | None:
    _, plan = await plan_now(conn, request)
    return plan


async def trial(
    conn: Connection,
    request: PlaceRequest,
    victims: Sequence[Candidate],
    planner: Planner | None = None,
    quotas: Collection[str] | None = None,
    *,
    explaining: bool = False,
) -> Any:
    """Where place would put the replica were these victims stopped; nothing is kept (a savepoint rolled back).

    `planner`: what is asked once they are gone (placeGroup's own planner);
    place's (statements.plan_now) when None. `quotas`: the tenants known to
    have a quota row of the class (None: not known); a trial whose victims'
    tenants have none has no quota row to lock.

    `explaining` (explain()'s trials, which claim nothing): none of the
    claim's locks is taken (no node or quota row locked FOR UPDATE, so a
    place never finds a node busy for an explain), and no lock is waited for
    longer than EXPLAIN_LOCK_WAIT: the rows the trial's own writes touch
    (the victims' shards, their nodes' pools, their tenants' counters) are
    held only until its savepoint is rolled back, and a trial that meets a
    claim holding one gives up at once what it holds (TrialMetClaim), so it
    never keeps a place waiting for more than its own few statements and
    never takes part in a deadlock.
    """
    savepoint = await conn.begin_nested()
    try:
        if explaining:
            await conn.execute(_WAIT_AT_MOST, {"wait": EXPLAIN_LOCK_WAIT})
        else:
            # The claim's lock order (preempt_and_claim), so a trial and a
            # claim never each hold what the other waits for: the victims'
            # nodes, their tenants' quota rows, then the shards (and the pools).
            await lock_nodes(conn, sorted({n for v in victims for n in v.node_ids}))
            tenants = {v.tenant for v in victims}
            if quotas is None or tenants & set(quotas):
                await held_beyond_guarantee(conn, request.gpu_class, tenants, lock=True)
        nodes = [
            r.node_id for r in await conn.execute(_FORGET, {"ids": [v.replica_id for v in victims]})
        ]
        await refresh_pools(conn, nodes)
        if planner is None:
            return await _place_plan(conn, request)
        return await planner(conn)
    except Exception as error:
        if explaining and sqlstate(error) == LOCK_NOT_AVAILABLE:
            raise TrialMetClaim() from error
        raise
    finally:
        await savepoint.rollback()


# What place() claims with once a set's victims are stopped (preempt_and_claim's `claim`).
Claim = Callable[[Connection], Awaitable[Any]]


class TrialMetClaim(Exception):
    """An explaining trial met a row a claim holds, and gave up what it held (its savepoint rolled back)."""


# Explaining trials that met a claim's row and were tried again (for /metrics).
EXPLAIN_RETRIES = _Cuts()


class _Trials:
    """One search's trials, each set tried once (the search with budgets ignored asks again).

    `claiming` (place() only): the first set the search tries is not tried
    in a savepoint but claimed (preempt_and_claim with `claiming`): on a
    large fleet the first set in order that counting leaves is nearly always
    the one chosen, and a trial costs as many round trips again as the
    claim. Whatever the claim answers but "no room" ends the search
    (`claimed`); "no room" is what a trial would have said, and the set is
    then tried as any other, so the search goes on exactly as with a trial
    (and a trial that finds room where the claim found none answers
    Changed(no_room=True), as a claim after a trial does).
    """

    def __init__(
        self,
        conn: Connection,
        request: PlaceRequest,
        planner: Planner | None,
        claiming: Callable[[Sequence[Candidate]], Awaitable[Any]] | None = None,
        explaining: bool = False,
    ) -> None:
        self.conn, self.request, self.planner = conn, request, planner
        self.explaining = explaining
        self.plans: dict[tuple[str, ...], Any] = {}
        # Tenants with a quota row of the class, as the last standing read.
        self.quotas: Collection[str] | None = None
        self.claiming = claiming
        # What the claim of the first set answered, when that ended the search.
        self.claimed: Any = None

    @property
    def spent(self) -> bool:
        return len(self.plans) >= SEARCH_BOUND

    async def plan(self, victims: Sequence[Candidate]) -> Any:
        ids = tuple(sorted(v.replica_id for v in victims))
        if ids not in self.plans:
            claiming, self.claiming = self.claiming, None
            if claiming is not None:
                outcome = await claiming(victims)
                if not (isinstance(outcome, Changed) and outcome.no_room):
                    self.claimed = outcome
                    self.plans[ids] = outcome
                    return outcome
            plan = await self._try(victims)
            if claiming is not None and plan is not None:
                # The planner found room the claim did not.
                self.claimed = Changed(no_room=True)
            self.plans[ids] = plan
        return self.plans[ids]

    async def _try(self, victims: Sequence[Candidate]) -> Any:
        # An explaining trial that met a claim is tried again (the claim
        # lasts a few statements); one that keeps meeting claims is a
        # conflict, answered as the docs say one is (docs/scheduler/errors.md).
        for _ in range(MAX_ATTEMPTS):
            try:
                return await trial(
                    self.conn,
                    self.request,
                    victims,
                    self.planner,
                    self.quotas,
                    explaining=self.explaining,
                )
            except TrialMetClaim:
                EXPLAIN_RETRIES.add()
                log.info("an explaining trial met a claim's lock; trying it again")
                await asyncio.sleep(random.uniform(0, EXPLAIN_BACKOFF))
        raise TransactionConflict(MAX_ATTEMPTS)


async def _search(
    trials: _Trials, state: Standing, keep_budgets: bool, largest: int | None = None
) -> tuple[Choice | None, bool]:
    """The first set in order that fits, and whether the search stopped at a bound first."""
    for victims in _sets(trials.request, state, keep_budgets, largest):
        if victims is None:
            return None, True
        known = tuple(sorted(v.replica_id for v in victims)) in trials.plans
        if trials.spent and not known:
            return None, True
        plan = await trials.plan(victims)
        if plan is not None:
            return Choice(victims, plan), False
    return None, False


async def choose(
    conn: Connection,
    request: PlaceRequest,
    planner: Planner | None = None,
    *,
    explaining: bool = False,
    state: Standing | None = None,
) -> Choice | NoChoice:
    """The victim set place would stop for this request now (it fits on no free GPUs), or why none.

    `planner`: placeGroup's (see trial); `request` then stands for the whole
    group (its class, its GPUs as shards of one, its charge). `state`: the
    candidates as the caller read them (a group of several GPU classes), not
    read here. `explaining`: explain()'s search (see trial).

    Writes nothing that stays: explain() calls it as place() does. For a
    shape of one shard, the sets of one victim are tried first from windows
    of candidates read in their order (_SINGLES; WINDOWS: 8, then
    SEARCH_BOUND): on a large fleet a set of one usually makes room, and
    reading every candidate is what costs. Only when none of them does is
    every candidate read; a set tried once is not tried again.
    """
    return await _choose(_Trials(conn, request, planner, explaining=explaining), state=state)


async def preempt(
    conn: Connection,
    request: PlaceRequest,
    actor: str | None,
    claim: Claim,
    mine: Headroom | None = None,
) -> Any:
    """place()'s preemption: the set choose() would choose, its victims stopped and the replica claimed.

    Answers as preempt_and_claim does (Allocated with `preempted`, the busy
    nodes, or Changed), or NoChoice. The first set the search tries is
    claimed rather than tried (_Trials says why): the set stopped is the
    one choose() answers on the same data. `mine`: the placing tenant's
    Headroom of the class, read by place() in this transaction.
    """

    async def claiming(victims: Sequence[Candidate]) -> Any:
        return await preempt_and_claim(conn, request, Choice(tuple(victims), None), actor, claim)

    trials = _Trials(conn, request, None, claiming=claiming)
    choice = await _choose(trials, mine)
    if trials.claimed is not None:
        return trials.claimed
    if isinstance(choice, NoChoice):
        return choice
    return await preempt_and_claim(conn, request, choice, actor, claim)


async def _choose(
    trials: _Trials, mine: Headroom | None = None, state: Standing | None = None
) -> Choice | NoChoice:
    conn, request = trials.conn, trials.request
    if request.shards == 1 and trials.planner is None and state is None:
        for window in WINDOWS:
            windowed, cut = await standing(conn, request, window=window, mine=mine)
            trials.quotas = set(windowed.beyond)
            choice, _ = await _search(trials, windowed, keep_budgets=True, largest=1)
            if choice is not None or not cut:
                break
        if choice is not None:
            return choice
    if state is None:
        state, _ = await standing(conn, request, mine=mine)
    trials.quotas = set(state.beyond)
    if not state.candidates:
        return NoChoice(
            f"no replica of priority below {request.charge.priority} holds "
            f"{request.gpu_class} GPUs, and none may be reclaimed"
        )
    choice, cut = await _search(trials, state, keep_budgets=True)
    if choice is not None:
        return choice
    if cut:
        SEARCH_CUT.add()
    bound = (
        f" (the search stopped after {SEARCH_BOUND} sets tried or {MAX_SETS} drawn of one size)"
        if cut
        else ""
    )
    why = (
        f"no set of the {len(state.candidates)} replicas that may be preempted makes room for "
        f"it{bound}"
    )
    if not state.budgets or cut:
        return NoChoice(why)
    # Would a set make room but for the budgets? Those are what blocked it:
    # tried, never claimed (a set that breaks a budget is never stopped).
    trials.claiming = None
    ignoring, _ = await _search(trials, state, keep_budgets=False)
    if ignoring is None:
        return NoChoice(why)
    broken = budgets_broken(ignoring.victims, state.budgets)
    names = ", ".join(f"{b.tenant}/{b.deployment} (minAvailable {b.min_available})" for b in broken)
    return NoChoice(
        f"{why} without taking a deployment below its disruption budget: {names}",
        tuple(BudgetRecord(b.deployment, b.tenant, b.min_available, b.placed) for b in broken),
    )


@dataclass(frozen=True)
class Changed:
    """Search again: the victims or their budgets changed between the search and the locks.

    `no_room`: they had not; the claim found no room where the trial had
    (what was read changed elsewhere, or a disagreement a place retried a
    few times reports as a conflict).
    """

    no_room: bool = False


async def preempt_and_claim(
    conn: Connection,
    request: PlaceRequest,
    choice: Choice,
    actor: str | None,
    claim: Callable[[Connection], Awaitable[Any]],
) -> Any:
    """Stop the chosen victims and claim the replica, in one savepoint: all of it, or nothing.

    `claim(conn)`: place's own claim (or placeGroup's), which never waits
    for a lock; it answers what it holds (Allocated), the set of nodes
    another transaction holds, or None (no room after all). Answers what it
    holds (an Allocated with `preempted`), the busy nodes (nothing held: the
    caller waits for them and searches again), or Changed. ChargeRefused
    (the tenant's limit) goes up, nothing held.
    """
    victims = choice.victims
    savepoint = await conn.begin_nested()
    try:
        await lock_nodes(conn, sorted({n for v in victims for n in v.node_ids}))
        budgets = await budget_lines(
            conn, {(v.tenant, v.deployment) for v in victims if v.deployment is not None}, lock=True
        )
        beyond: dict[str, int] = {}
        now: dict[str, list[tuple[str, int]]] = defaultdict(list)
        locked = await conn.execute(
            _LOCK_QUOTAS_READ_SHARDS,
            {
                "cls": request.gpu_class,
                "tenants": sorted({v.tenant for v in victims} | {request.charge.tenant_id}),
                "ids": [v.replica_id for v in victims],
            },
        )
        for r in locked:
            if r.replica_id is None:
                beyond[r.tenant] = r.beyond
            else:
                now[r.replica_id].append((r.shard_id, r.fence))
        reclaim_ok = True
        if any(v.kind is PreemptionKind.RECLAIM for v in victims):
            mine = (await headroom(conn, request.charge.tenant_id, [request.gpu_class]))[
                request.gpu_class
            ]
            reclaim_ok = reclaiming(mine.used, request.gpus, mine.guaranteed)
        if (
            any(tuple(now.get(v.replica_id, ())) != v.shards for v in victims)
            or not allowed(victims, budgets, beyond)
            or not reclaim_ok
        ):
            await savepoint.rollback()
            return Changed()
        for v in victims:
            record = record_of(v, request.replica_id, request.gpu_class)
            await record_event(
                conn,
                "replica_preempted",
                node_id=v.node_ids[0],
                replica_id=v.replica_id,
                actor=actor or ACTOR,
                reason=record.reason,
                detail={
                    "preemptedBy": request.replica_id,
                    "kind": v.kind.value,
                    "tenant": v.tenant,
                    "priority": v.priority,
                    "deployment": v.deployment,
                    "gpus": v.gpus,
                    "nodeIds": list(v.node_ids),
                    "byTenant": request.charge.tenant_id,
                },
            )
            await preempt_replica(
                conn, v.replica_id, request.replica_id, actor, record.reason, nodes=v.node_ids
            )
        outcome = await claim(conn)
        if outcome is not None and not isinstance(outcome, set):
            # Kept to the transaction's commit (a RELEASE fewer).
            await keep_until_commit(savepoint)
            if isinstance(outcome, Allocated):
                return replace(outcome, preempted=choice.records(request))
            return outcome
        await savepoint.rollback()
        return outcome if isinstance(outcome, set) and outcome else Changed(no_room=True)
    except BaseException:
        if savepoint.is_active:
            await savepoint.rollback()
        raise
