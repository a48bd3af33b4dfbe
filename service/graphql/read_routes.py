"""Which answers may come from a read replica: the one table, by root field, and the request's verdict.

A request's reads may go to a read replica (INVENTORY_READ_DATABASE_URL,
service/database/read_routing.py) when it is a query and every root field
it selects is below: each tolerates an answer at most INVENTORY_READ_MAX_LAG
seconds stale (or its own maxAge). The dashboard's and ctl's pages ask these
alone. Everything else reads the primary: mutations (their answers are read
after their own writes), allocations (a scheduler reads back what it placed),
events (a cursor must not skip what a lagging replica has not replayed yet),
tokens, weightsEvictable (an eviction tool must never see a pin as absent),
shardsToMove (engines are stopped and replicas released from it: a shard
tainted a moment ago must not be missing from it), remediations (the
operator's automation starts what it lists: one started a moment ago must not
read PENDING) and validationsToRun (an agent would run a test that already
passed).

A new read-only query that tolerates staleness joins the table, and reads
through Context.read (or FastRequest.read): nothing else changes. Both routes
set the verdict before anything runs: Strawberry's view through the
ReadRouting extension below, the fast path in its front door's plan
(service/graphql/fast/front_door.py), from the same function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from graphql import FieldNode, OperationDefinitionNode, OperationType, get_operation_ast
from strawberry.extensions import SchemaExtension

from service.database import request_state

STALE_READS_ALLOWED: Final = frozenset(
    {
        "node",
        "nodes",
        "freeGpus",
        "fabrics",
        "gpuClasses",
        "fit",
        "explainPlacement",
        "fitGroup",
        "explainGroupPlacement",
        # Operators' pages (ctl groups, the dashboard's group view). A
        # scheduler has placeGroup's own answer, and scaleGroup checks the
        # generation it read on the primary: a stale one is CONFLICT.
        "groups",
        "group",
    }
)


def allows_stale_reads(operation: OperationDefinitionNode | None) -> bool:
    """A query whose every root field is in STALE_READS_ALLOWED (`__typename` aside).

    A fragment at the root is not looked into: such a request reads the primary.
    """
    if operation is None or operation.operation != OperationType.QUERY:
        return False
    asked = False
    for selection in operation.selection_set.selections:
        if not isinstance(selection, FieldNode):
            return False
        name = selection.name.value
        if name == "__typename":
            continue
        if name not in STALE_READS_ALLOWED:
            return False
        asked = True
    return asked


class ReadRouting(SchemaExtension):
    """Strawberry's view: the request's verdict, set before it executes."""

    def on_execute(self) -> Iterator[None]:
        state = request_state.current()
        if state is not None:
            context = self.execution_context
            document = context.graphql_document
            operation = (
                None if document is None else get_operation_ast(document, context.operation_name)
            )
            state.replica_allowed = allows_stale_reads(operation)
        yield
