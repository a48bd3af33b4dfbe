"""The schema: the contract's types plus what the service adds, with its limits."""

from __future__ import annotations

import logging

import strawberry
from graphql import GraphQLError
from strawberry.extensions import MaskErrors, ParserCache, QueryDepthLimiter, ValidationCache
from strawberry.schema.config import StrawberryConfig
from strawberry.tools import merge_types

from service.errors import InventoryError

from .allocation_mutations import AllocationMutations
from .event_queries import EventQueries
from .mutations import NodeMutations
from .placement import PlacementQueries
from .queries import NodeQueries
from .scalars import BYTES_SCALAR, Bytes
from .subscriptions import EventSubscriptions

log = logging.getLogger(__name__)

Query = merge_types("Query", (NodeQueries, EventQueries, PlacementQueries))
Mutation = merge_types("Mutation", (NodeMutations, AllocationMutations))
Subscription = merge_types("Subscription", (EventSubscriptions,))


def is_unexpected(error: GraphQLError) -> bool:
    """Mask only bugs: validation errors and InventoryErrors are for the caller to read."""
    original = error.original_error
    if original is None or isinstance(original, (GraphQLError, InventoryError)):
        return False
    log.error("unexpected error at %s", error.path, exc_info=original)
    return True


MAX_QUERY_DEPTH = 12

schema = strawberry.Schema(
    query=Query,
    mutation=Mutation,
    subscription=Subscription,
    config=StrawberryConfig(scalar_map={Bytes: BYTES_SCALAR}),
    extensions=[
        lambda: MaskErrors(should_mask_error=is_unexpected, error_message="internal error"),
        lambda: QueryDepthLimiter(max_depth=MAX_QUERY_DEPTH),
        ParserCache,
        ValidationCache,
    ],
)
