"""placeGroup's preemption: the whole group placed by stopping victims, or nothing stopped.

The victims are searched as for place() (placement/preemption.py), the group
standing in as one replica of all its GPUs of its class, charged as the
group is, and each victim set tried with the group's own planner (every
role, locality and KV path rule); the chosen set is stopped and every member
claimed in one savepoint, or nothing is. A group of several GPU classes is
placed as NEVER, and its answer says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from service.database.connections import Connection
from service.scheduling.groups.charging import asked_by_class
from service.scheduling.groups.requests import GroupRequest
from service.scheduling.place_request import PlaceRequest
from service.scheduling.placement import preemption
from service.scheduling.placement.claims import wait_for_nodes
from service.scheduling.tenancy.victims import Preemption

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
    if len(classes) != 1:
        return preemption.NoChoice(
            "a group of several GPU classes is not preempted for (placed as NEVER)"
        )
    ((gpu_class, gpus),) = classes.items()
    stand_in = PlaceRequest(
        replica_id=group.group_id,
        gpu_class=gpu_class,
        gpus_per_shard=1,
        shards=gpus,
        charge=group.charge,
        preemption=group.preemption,
    )
    choice = await preemption.choose(conn, stand_in, planner)
    if isinstance(choice, preemption.NoChoice):
        return choice
    got = await preemption.preempt_and_claim(conn, stand_in, choice, actor, claim)
    if isinstance(got, set):
        # Nothing is held (its savepoint was rolled back).
        await wait_for_nodes(conn, got)
        return None
    if got is None or isinstance(got, preemption.Changed):
        return None
    return got, choice.records(stand_in)
