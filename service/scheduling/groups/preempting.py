"""placeGroup's preemption: the whole group placed by stopping victims, or nothing stopped.

The victims are searched as for place() (placement/preemption.py), the group
standing in as one replica of all its GPUs of its class, charged as the
group is, and each victim set tried with the group's own planner (every
role, locality and KV path rule); the chosen set is stopped and every member
claimed in one savepoint, or nothing is. A group of several GPU classes is
preempted for over the victims of all its classes at once (_over_every_class),
of lower priority only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from service.database.connections import Connection
from service.scheduling.groups.charging import asked_by_class
from service.scheduling.groups.requests import GroupRequest
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import preemption
from service.scheduling.placement.claims import wait_for_nodes
from service.scheduling.tenancy.victims import (
    BudgetLine,
    Candidate,
    Preemption,
    PreemptionKind,
    record_of,
)

# What the group's claim answers once it holds every member (placeGroup: the
# group's generation; scaleGroup: the plan of the replicas it added).
Held = TypeVar("Held")


async def preempt_for(
    conn: Connection,
    group: GroupRequest,
    actor: str | None,
    planner: preemption.Planner,
    claim: Callable[[Connection], Awaitable[Held | set[str] | None]],
) -> tuple[Held, tuple[Preemption, ...]] | preemption.NoChoice | None:
    """(what the claim holds, the victims) once held; why none would do; None: plan again.

    `group`: the replicas to hold (scaleGroup: the ones it adds, under the
    group's id, charge and preemption). `planner(conn)`: their plan on the
    fleet as it is, None when it does not fit. `claim(conn)`: them held
    without waiting for a lock: what it holds, the nodes another transaction
    holds, or None.
    """
    classes = asked_by_class(group)
    stand_in = PlaceRequest(
        replica_id=group.group_id,
        gpu_class=min(classes),
        gpus_per_shard=1,
        shards=sum(classes.values()),
        charge=group.charge,
        preemption=group.preemption,
    )
    if len(classes) == 1:
        choice = await preemption.choose(conn, stand_in, planner)
        held_class: Mapping[str, str] = {}
    else:
        union = await _over_every_class(conn, stand_in, classes)
        if isinstance(union, preemption.NoChoice):
            return union
        state, held_class = union
        choice = await preemption.choose(conn, stand_in, planner, state=state)
    if isinstance(choice, preemption.NoChoice):
        return choice
    got = await preemption.preempt_and_claim(conn, stand_in, choice, actor, claim)
    if isinstance(got, set):
        # Nothing is held (its savepoint was rolled back).
        await wait_for_nodes(conn, got)
        return None
    if got is None or isinstance(got, preemption.Changed):
        return None
    records = tuple(
        record_of(v, group.group_id, held_class.get(v.replica_id, stand_in.gpu_class))
        for v in choice.victims
    )
    return got, records


async def _over_every_class(
    conn: Connection, stand_in: PlaceRequest, classes: Mapping[str, int]
) -> tuple[preemption.Standing, dict[str, str]] | preemption.NoChoice:
    """The victims of a group of several GPU classes: of every class, one search over their union.

    Each class's candidates are read as for a group of that class alone,
    and only those of lower priority are kept (a group of several classes
    reclaims nothing: a reclaim is a class's guarantee, checked per class).
    A replica holding GPUs of several of the classes is one candidate. A
    set may fit by counting when, in every class, what it frees there plus
    what is free holds what the group asks of it; the search then tries the
    sets in victims.set_key order with the group's planner (every class at
    once), so the set chosen is the least that makes room for all of the
    group. Answers the search's standing and the class each victim is
    counted under (the first of the group's classes it holds).
    """
    of_class: dict[str, dict[str, Candidate]] = {}
    free: dict[str, int] = {}
    budgets: dict[tuple[str, str], BudgetLine] = {}
    for gpu_class, gpus in sorted(classes.items()):
        request = replace(stand_in, gpu_class=gpu_class, shards=gpus)
        state, _ = await preemption.standing(conn, request)
        of_class[gpu_class] = {
            c.replica_id: c for c in state.candidates if c.kind is PreemptionKind.LOWER_PRIORITY
        }
        budgets.update(state.budgets)
        free[gpu_class] = (
            state.free_shards if gpus > 1 else await preemption.shards_room(conn, request)
        )
    merged: dict[str, Candidate] = {}
    held_class: dict[str, str] = {}
    for gpu_class in sorted(of_class):
        for replica_id, candidate in of_class[gpu_class].items():
            if replica_id not in merged:
                merged[replica_id], held_class[replica_id] = candidate, gpu_class
                continue
            on: dict[str, int] = defaultdict(int)
            for node_id, n in (*merged[replica_id].class_gpus, *candidate.class_gpus):
                on[node_id] += n
            merged[replica_id] = replace(merged[replica_id], class_gpus=tuple(sorted(on.items())))
    if not merged:
        return preemption.NoChoice(
            f"no replica of priority below {stand_in.charge.priority} holds GPUs of "
            f"{', '.join(sorted(classes))} (a group of several GPU classes reclaims none)"
        )

    def may_fit(victims: Sequence[Candidate]) -> bool:
        for gpu_class, asked in classes.items():
            there = of_class[gpu_class]
            freed = sum(there[v.replica_id].class_total for v in victims if v.replica_id in there)
            if free[gpu_class] + freed < asked:
                return False
        return True

    state = preemption.Standing(
        tuple(merged.values()), budgets, beyond={}, rooms={}, free_shards=0, may_fit=may_fit
    )
    return state, held_class
