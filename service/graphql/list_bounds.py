"""How long each list a request passes in may be: one table, read before any value is coerced.

Issue 44: a request's variables were coerced by graphql-core and converted
by Strawberry, on the event loop, before the domain refused an oversized
list: a 1 MiB registerNode listing 9,000 GPUs held every other caller for
seconds on a loaded machine, to be told that a node has at most 64. Every
list argument and list input field of the schema is bounded here, each by a
constant of service/bounds.py (the bound's one home, which the domain's own
checks read too), and the GraphQL layer refuses a longer list at the input
boundary (input_values.py): a literal by validation, a variable by a walk of
the raw JSON value that reads a list's length before any of its entries.
The answer is BAD_INPUT naming the field, the length and the bound
(errors.TooManyEntries).

tests/api/test_list_bounds.py walks the schema: a list argument or input
field missing from the table, or an entry that names nothing, fails it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from weakref import WeakKeyDictionary

from graphql import (
    GraphQLArgument,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
)

from service.bounds import (
    MAX_DIRECTORIES,
    MAX_ENGINE_VERSIONS,
    MAX_EVENT_KINDS,
    MAX_EXCLUDED_NODES,
    MAX_FABRICS,
    MAX_FILESYSTEMS,
    MAX_GPUS,
    MAX_GPUS_PER_SHARD,
    MAX_GROUP_ROLES,
    MAX_HCAS,
    MAX_HEALTH_REASONS,
    MAX_LABELS,
    MAX_RUNNING_SHARDS,
    MAX_SHARDS,
    MAX_TENANT_QUOTAS,
    MAX_TOLERATIONS,
    MAX_WEIGHTS,
    MAX_XIDS,
)

# Input fields as "InputType.field", arguments as "Type.field(argument)".
LIST_BOUNDS: Final[Mapping[str, int]] = {
    "NodeInput.labels": MAX_LABELS,
    "NodeInput.gpus": MAX_GPUS,
    "NodeInput.fabrics": MAX_FABRICS,
    "NodeInput.storage": MAX_FILESYSTEMS,
    "NodeInput.weights": MAX_WEIGHTS,
    "NodeInput.engineVersions": MAX_ENGINE_VERSIONS,
    "GpuInput.healthReasons": MAX_HEALTH_REASONS,
    "GpuInput.xids": MAX_XIDS,
    # A GPU's peers and nearest HCAs are the node's own.
    "GpuInput.nvlinkPeers": MAX_GPUS,
    "GpuInput.nearHcas": MAX_HCAS,
    "FabricInput.hcas": MAX_HCAS,
    "FilesystemInput.directories": MAX_DIRECTORIES,
    "AllocateInput.shards": MAX_SHARDS,
    "AllocateInput.tolerations": MAX_TOLERATIONS,
    "ShardInput.gpuIndices": MAX_GPUS_PER_SHARD,
    "PlaceInput.tolerations": MAX_TOLERATIONS,
    "PlaceGroupInput.roles": MAX_GROUP_ROLES,
    "ValidationInput.gpuIndices": MAX_GPUS,
    "Query.freeGpus(tolerations)": MAX_TOLERATIONS,
    "Query.events(kinds)": MAX_EVENT_KINDS,
    "Subscription.events(kinds)": MAX_EVENT_KINDS,
    "Query.fit(excludeNodes)": MAX_EXCLUDED_NODES,
    "Mutation.registerNode(runningShards)": MAX_RUNNING_SHARDS,
    "Mutation.heartbeat(runningShards)": MAX_RUNNING_SHARDS,
    "Mutation.taintGpus(indices)": MAX_GPUS,
    "Mutation.untaintGpus(indices)": MAX_GPUS,
    "TenantInput.quotas": MAX_TENANT_QUOTAS,
}

Holder = GraphQLArgument | GraphQLInputField


def holder_of(schema: GraphQLSchema, key: str) -> Holder | None:
    """The argument or input field a key of LIST_BOUNDS names; None when it names nothing."""
    owner, _, rest = key.partition(".")
    type_ = schema.get_type(owner)
    if rest.endswith(")") and "(" in rest:
        field_name, _, argument = rest[:-1].partition("(")
        if not isinstance(type_, (GraphQLObjectType, GraphQLInterfaceType)):
            return None
        field = type_.fields.get(field_name)
        return None if field is None else field.args.get(argument)
    if not isinstance(type_, GraphQLInputObjectType):
        return None
    input_field: GraphQLInputField | None = type_.fields.get(rest)
    return input_field


class ListBounds:
    """LIST_BOUNDS resolved against one schema: each argument's or input field's bound."""

    def __init__(self, schema: GraphQLSchema) -> None:
        # By the holder's identity: the schema holds every holder as long as
        # this object lives (one per schema, below).
        self._bounds: dict[int, int] = {}
        for key, bound in LIST_BOUNDS.items():
            holder = holder_of(schema, key)
            if holder is not None:  # an entry naming nothing: the test names it
                self._bounds[id(holder)] = bound

    def of(self, holder: Holder | None) -> int | None:
        """The bound of a list argument or input field; None for a holder of no list."""
        return None if holder is None else self._bounds.get(id(holder))


_resolved: WeakKeyDictionary[GraphQLSchema, ListBounds] = WeakKeyDictionary()


def list_bounds(schema: GraphQLSchema) -> ListBounds:
    """The schema's list bounds, resolved once."""
    found = _resolved.get(schema)
    if found is None:
        found = _resolved[schema] = ListBounds(schema)
    return found
