"""A group's members claimed in one round get what claiming them one by one gives (a seeded differential).

placeGroup claims members that are each on one node, of one GPU class,
without topology or tolerations, in one round (groups/claiming.py, claim_members:
their nodes locked at once, their GPUs read once and handed out member by
member, one store statement); every other group is claimed member by
member with the GPUs each node's packing gives it (groups/claiming.py),
which spreads a role's replicas over a node's NUMA nodes. The one-round
claim says it gives each member the GPUs the member-by-member claim would. Here both place the same
groups, one after the other until the cluster is full, on the same random
clusters (NVSwitch boards with two NUMA nodes, bridged pairs, small nodes,
NVLink domains; two fabrics, sick, held, tainted and cordoned GPUs and
nodes), and every member's GPUs must be the same.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from service.scheduling.groups import placing
from tests.support.api import Api
from tests.support.group_windows import CORDON, GROUPS, boards
from tests.support.groups import PLACE_GROUP, RELEASE_GROUP
from tests.support.two_fabrics import random_cluster


async def fill(api: Api, spec: dict[str, Any], k: int) -> list[Any]:
    """The group placed again and again until Unplaceable: each answer, then everything released."""
    answers: list[Any] = []
    while len(answers) <= 32:
        answer = (await api(PLACE_GROUP, {"input": {"groupId": f"g{k}-{len(answers)}", **spec}}))[
            "placeGroup"
        ]
        answers.append(answer)
        if answer["__typename"] != "GroupPlaced":
            break
    for placed in answers[:-1]:
        await api(RELEASE_GROUP, {"id": placed["groupId"]})
    return answers


@pytest.mark.seeds(range(6))
async def test_members_claimed_in_one_round_get_what_one_by_one_gives(
    api: Api, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(1000 + seed)
    await random_cluster(api, rng, nodes=(6, 12), gpus_of=boards)
    await api(CORDON, {"id": f"n{rng.randrange(6)}"})
    together = 0
    claim_members = placing.claim_members

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal together
        together += 1
        return await claim_members(*args, **kwargs)

    for k, spec in enumerate(GROUPS):
        monkeypatch.setattr(placing, "claim_members", counted)
        in_one_round = await fill(api, spec, k)
        # Member by member: the claim every group took before the one-round path.
        monkeypatch.setattr(placing, "claimed_together", lambda members: False)
        one_by_one = await fill(api, spec, k)
        monkeypatch.undo()
        assert in_one_round == one_by_one, (seed, k)
    # The one-round path did run (the groups above on one-node members).
    assert together >= 4, together
