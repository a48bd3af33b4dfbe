"""How a group's replicas share one node's GPUs: the NVLink groups as cells, one rule for plan and claim.

A node's GPUs that one set of roles are offered alike (a view:
planning.Board.view_of) are cells: the free GPUs of each NVLink group, then
the GPUs in none (or all of them, when no role of the view reads NVLink
groups). A take is so many shards of so many GPUs, each shard within one
cell when the shape asks nvlinkShards, anywhere otherwise. pack() finds
how many GPUs each take gets from each cell, trying the preferred way
first and every other way after it, so a set of takes fits iff pack finds
a packing.

The planner calls it on the counts its board read (cells in the order
`cells_of` gives: NVLink groups by free GPUs, most first); the claim calls
it under the node's lock on the counts of the GPUs it read there, cells
ordered the same way (by free GPUs, most first, then the group's number),
and hands each take the GPUs of the cells pack named. The same function
on the same counts: what the plan found room for, the claim takes, and a
lone caller never finds its plan gone (issue 44: prefill given GPUs 0 and
2 by index left decode no NVLink pair on a board the plan had judged by
counts, and placeGroup retried itself out into CONFLICT).

Preferred first, so that the answer is what it was wherever that fit: an
nvlinkShards shard in the group with the fewest free GPUs that holds it
(best fit, as topology_fit's fit order), a take without it from the GPUs
in no NVLink group first, then from the smallest groups, so large groups
stay whole for NVLink shards.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

# Free GPUs per cell: the NVLink groups (by free GPUs, most first), then the
# GPUs in no group, always last.
Cells = tuple[int, ...]


class Take(NamedTuple):
    """`shards` shards of `per` GPUs; `nvlink`: each shard within one NVLink group.

    A tuple: the planner hashes many of them (its caches of derived facts).
    """

    per: int
    shards: int
    nvlink: bool

    @property
    def gpus(self) -> int:
        return self.per * self.shards


# Per take, the GPUs it gets from each cell (for an nvlink take, per shard
# the cell it lies in: `shards` entries).
Packing = tuple[tuple[int, ...], ...]


def cells_of(groups: tuple[int, ...] | None, free: int) -> Cells:
    """The cells of a view from its facts: the NVLink groups' free GPUs (most first), then the rest.

    `groups`: the free GPUs of each NVLink group (TopologyFacts.groups), or
    None when no role of the view reads them: one cell of every free GPU.
    """
    if groups is None:
        return (free,)
    grouped = tuple(sorted((g for g in groups if g > 0), reverse=True))
    return (*grouped, free - sum(grouped))


def usable_of(groups: tuple[int, ...], per: int) -> int:
    """The GPUs whole nvlinkShards shards of `per` take from NVLink groups with these free GPUs.

    What topology_fit.pool_facts counts in SQL for a pool's summary.
    """
    return sum(g // per for g in groups) * per


@lru_cache(maxsize=65536)
def pack(cells: Cells, takes: tuple[Take, ...]) -> tuple[Packing, Cells] | None:
    """The first packing of the takes into the cells, preferred first, and the cells it leaves; None: none.

    Per take: for an nvlink take, the cell of each shard (an NVLink group,
    never the last cell); otherwise, how many GPUs from each cell.
    """
    failed: set[tuple[Cells, int, int]] = set()
    groups = len(cells) - 1

    def shard_cells(left: Cells) -> list[int]:
        # Best fit: the group with the fewest free GPUs that holds the shard, then the first.
        return sorted(range(groups), key=lambda c: (left[c], c))

    def spread(left: Cells, gpus: int) -> list[tuple[int, ...]]:
        """Every way to take `gpus` GPUs from the cells, the preferred first."""
        order = [groups, *sorted(range(groups), key=lambda c: (left[c], c))]
        ways: list[tuple[int, ...]] = []

        def fill(k: int, need: int, taken: list[int]) -> None:
            if need == 0:
                ways.append(tuple(taken))
                return
            if k == len(order):
                return
            if sum(left[c] for c in order[k:]) < need:
                return
            cell = order[k]
            for amount in range(min(left[cell], need), -1, -1):
                taken[cell] += amount
                fill(k + 1, need - amount, taken)
                taken[cell] -= amount

        fill(0, gpus, [0] * len(cells))
        return ways

    chosen: list[tuple[int, ...]] = []

    def place(t: int, shard: int, left: Cells, current: list[int]) -> Cells | None:
        if t == len(takes):
            return left
        key = (left, t, shard)
        if key in failed:
            return None
        take = takes[t]
        if take.nvlink:
            for c in shard_cells(left):
                if left[c] < take.per:
                    continue
                after = (*left[:c], left[c] - take.per, *left[c + 1 :])
                current.append(c)
                if shard + 1 == take.shards:
                    chosen.append(tuple(current))
                    found = place(t + 1, 0, after, [])
                    if found is not None:
                        return found
                    chosen.pop()
                else:
                    found = place(t, shard + 1, after, current)
                    if found is not None:
                        return found
                current.pop()
        else:
            for way in spread(left, take.gpus):
                after = tuple(n - w for n, w in zip(left, way, strict=True))
                chosen.append(way)
                found = place(t + 1, 0, after, [])
                if found is not None:
                    return found
                chosen.pop()
        failed.add(key)
        return None

    if any(t.nvlink for t in takes) and groups == 0:
        return None
    left = place(0, 0, cells, [])
    if left is None:
        return None
    return tuple(chosen), left


def leave(cells: Cells, last: Cells, left: Cells) -> tuple[Cells, Cells]:
    """The cells a packing leaves (`left`), and of each, the GPUs used last still there.

    A take gets a cell's other GPUs before those a PREFER_NO_SCHEDULE taint
    sends last (the claim's order within a cell), so a cell loses such GPUs
    only once its others are gone.
    """
    still = tuple(x - max(0, (n - k) - (n - x)) for n, x, k in zip(cells, last, left, strict=True))
    return left, still


@lru_cache(maxsize=65536)
def nvlink_room(cells: Cells, takes: tuple[Take, ...], per: int) -> tuple[int, Cells]:
    """How many more nvlinkShards shards of `per` GPUs fit beside the takes, and cells that hold them.

    The most over every packing of the takes (not only the preferred one):
    the cells answered are those the takes leave in a packing that leaves
    room for that many, so that a group of `per` free GPUs is among them
    exactly when one more fits.
    """
    if len(cells) == 1:
        packed = pack(cells, takes)
        return 0, cells if packed is None else packed[1]
    most = sum(c // per for c in cells[:-1])
    for room in range(most, -1, -1):
        packed = pack(cells, (*takes, Take(per, room, True))) if room else pack(cells, takes)
        if packed is None:
            continue
        packing, left = packed
        if room:
            # Give the extra shards' GPUs back: the cells as the takes alone leave them.
            back = list(left)
            for c in packing[-1]:
                back[c] += per
            left = tuple(back)
        return room, left
    return 0, cells
