"""The schema: the contract's types plus what the service adds, with its limits."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import (
    AddValidationRules,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    ValidationCache,
)
from strawberry.schema.config import StrawberryConfig
from strawberry.tools import merge_types

from .fencing_types import FencingMutations
from .masking import MaskUnexpected, log_expected
from .operations.allocation_mutations import AllocationMutations
from .operations.event_queries import EventQueries
from .operations.gpu_mutations import GpuMutations
from .operations.groups import GroupMutations, GroupQueries
from .operations.health_mutations import HealthMutations
from .operations.health_queries import HealthQueries
from .operations.mutations import NodeMutations
from .operations.placement import PlacementQueries
from .operations.queries import NodeQueries
from .operations.subscriptions import EventSubscriptions
from .operations.token_admin import TokenMutations, TokenQueries
from .pages import PageTruncation
from .permissions import guard_root_fields
from .read_routes import ReadRouting
from .request_errors import CodeValidationErrors
from .scalars import BYTES_SCALAR, DATETIME_SCALAR, Bytes

log = logging.getLogger(__name__)

Query = merge_types(
    "Query",
    (NodeQueries, EventQueries, TokenQueries, PlacementQueries, GroupQueries, HealthQueries),
)
Mutation = merge_types(
    "Mutation",
    (
        NodeMutations,
        TokenMutations,
        AllocationMutations,
        GpuMutations,
        FencingMutations,
        GroupMutations,
        HealthMutations,
    ),
)
Subscription = merge_types("Subscription", (EventSubscriptions,))


# Every root field needs a role (permissions.py ROOT_FIELD_ROLES).
ROOT_TYPES = {"Query": Query, "Mutation": Mutation, "Subscription": Subscription}
for _name, _root in ROOT_TYPES.items():
    guard_root_fields(_name, _root)

MAX_QUERY_DEPTH = 12
# Bounds on one document, so a single request cannot make the parser and
# validator do unbounded work: aliases multiply resolver calls (an alias
# flood of `a1: nodes ... a999: nodes` is 999 list queries), tokens bound the
# parse. Generous for any real client: the agent's mutations use variables
# and a few dozen tokens.
MAX_ALIASES = 100
MAX_TOKENS = 5000

# The limiters' rules, made once. ValidationCache keys on the rule classes and
# each QueryDepthLimiter or MaxAliasesLimiter makes new ones, so limiters made
# per request made every request miss the cache and validate again.
LIMIT_RULES = (
    *QueryDepthLimiter(max_depth=MAX_QUERY_DEPTH).validation_rules,
    *MaxAliasesLimiter(max_alias_count=MAX_ALIASES).validation_rules,
)


class InventorySchema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: Any | None = None
    ) -> None:
        # Strawberry logs every error at ERROR with its traceback; here an
        # expected one is a line at INFO and an unexpected one is logged once,
        # with its traceback, where it is masked (masking.py).
        log_expected(errors)


schema = InventorySchema(
    query=Query,
    mutation=Mutation,
    subscription=Subscription,
    config=StrawberryConfig(scalar_map={Bytes: BYTES_SCALAR, datetime: DATETIME_SCALAR}),
    # A short list says so, on every route (pages.py). With the fast path on,
    # the app adds plain-field completion beneath it when it is built
    # (service/graphql/fast/install.py); the schema itself never needs it.
    execution_context_class=PageTruncation,
    extensions=[
        MaskUnexpected,
        CodeValidationErrors,
        ReadRouting,
        lambda: MaxTokensLimiter(max_token_count=MAX_TOKENS),
        lambda: AddValidationRules(list(LIMIT_RULES)),
        ParserCache,
        ValidationCache,
    ],
)
