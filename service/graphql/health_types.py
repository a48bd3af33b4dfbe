"""GraphQL types of fleet health: taints, tolerations, and what reads them on a GPU and a node.

The domain's enums are exposed as they are (service/scheduling/taints.py);
the inputs translate to the domain's requests and nothing is decided here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import strawberry

from service.fleet.health.taints import TaintRequest
from service.scheduling import taints
from service.scheduling.taints import Taint as TaintRecord

from .context import Info
from .loaders import now_or_later

strawberry.enum(taints.TaintEffect, name="TaintEffect")
strawberry.enum(taints.TaintSource, name="TaintSource")
strawberry.enum(taints.TolerationOperator, name="TolerationOperator")


@strawberry.type(
    description=(
        "A mark that keeps work off a GPU or node: NO_SCHEDULE and NO_EXECUTE unless tolerated, "
        "PREFER_NO_SCHEDULE used last. A cordon shows as an OPERATOR NO_SCHEDULE taint with "
        "key cordon (a drain: key drain), lifted by uncordon."
    )
)
class Taint:
    """Served by service.scheduling.taints.Taint itself (types.SERVED_BY_RECORDS)."""

    key: str
    value: str | None
    effect: taints.TaintEffect
    source: taints.TaintSource
    reason: str
    since: datetime
    actor: str | None = strawberry.field(default=None, description="Who set it.")


@strawberry.input
class TaintInput:
    key: str
    value: str | None = None
    effect: taints.TaintEffect
    reason: str

    def to_request(self) -> TaintRequest:
        return TaintRequest(self.key, self.value, self.effect, self.reason)


@strawberry.input(
    description=(
        "A toleration matches a taint with the same key (and value, for EQUAL); effect null "
        "matches every effect. tolerationSeconds: how long a NO_EXECUTE taint is tolerated."
    )
)
class TolerationInput:
    key: str
    operator: taints.TolerationOperator = taints.TolerationOperator.EQUAL
    value: str | None = None
    effect: taints.TaintEffect | None = None
    toleration_seconds: int | None = None

    def to_toleration(self) -> taints.Toleration:
        return taints.Toleration(
            key=self.key,
            operator=self.operator,
            value=self.value,
            effect=self.effect,
            toleration_seconds=self.toleration_seconds,
        )


def tolerations_of(given: list[TolerationInput] | None) -> tuple[taints.Toleration, ...]:
    return tuple(t.to_toleration() for t in given or ())


TOLERATIONS = (
    "Taints the request tolerates: a GPU withheld by NO_SCHEDULE or NO_EXECUTE taints is "
    "offered only when every one of them is tolerated; tolerated PREFER_NO_SCHEDULE GPUs are not "
    "used last."
)


def node_taints(node_id: str, info: Info) -> Any:
    """Node.taints: the node's own (not its GPUs'), cordon or drain included."""

    def own(found: list[TaintRecord]) -> list[TaintRecord]:
        return [t for t in found if t.gpu_index is None]

    return now_or_later(info.context.loaders.taints, node_id, own)
