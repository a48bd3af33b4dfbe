"""The schema: the contract's types plus what the service adds, with its limits."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import AddValidationRules, MaxTokensLimiter
from strawberry.schema.config import StrawberryConfig
from strawberry.tools import merge_types

from .checked_documents import DocumentChecks
from .document_cost import MAX_ALIASES, MAX_FIELDS, MAX_QUERY_DEPTH, MAX_TOKENS, DocumentCost
from .fencing_types import FencingMutations
from .input_values import CheckedLiterals
from .masking import MaskUnexpected, log_expected
from .operations.allocation_mutations import AllocationMutations
from .operations.event_queries import EventQueries
from .operations.gpu_mutations import GpuMutations
from .operations.groups import GroupMutations, GroupQueries
from .operations.health_mutations import HealthMutations
from .operations.health_queries import HealthQueries
from .operations.maintenance import MaintenanceMutations, MaintenanceQueries
from .operations.mutations import NodeMutations
from .operations.placement import PlacementQueries
from .operations.queries import NodeQueries
from .operations.reservations import ReservationMutations, ReservationQueries
from .operations.subscriptions import EventSubscriptions
from .operations.tenancy import TenancyMutations, TenancyQueries
from .operations.token_admin import TokenMutations, TokenQueries
from .pages import PageTruncation
from .permissions import guard_root_fields
from .read_routes import ReadRouting
from .request_errors import CodeValidationErrors
from .scalars import BYTES_SCALAR, DATETIME_SCALAR, Bytes

log = logging.getLogger(__name__)

Query = merge_types(
    "Query",
    (
        NodeQueries,
        EventQueries,
        TokenQueries,
        PlacementQueries,
        GroupQueries,
        HealthQueries,
        TenancyQueries,
        MaintenanceQueries,
        ReservationQueries,
    ),
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
        TenancyMutations,
        MaintenanceMutations,
        ReservationMutations,
    ),
)
Subscription = merge_types("Subscription", (EventSubscriptions,))


# Every root field needs a role (permissions.py ROOT_FIELD_ROLES).
ROOT_TYPES = {"Query": Query, "Mutation": Mutation, "Subscription": Subscription}
for _name, _root in ROOT_TYPES.items():
    guard_root_fields(_name, _root)

# The document's bounds (document_cost.py: depth, aliases and fields after
# spreading, each fragment measured once; the token limit bounds the parse)
# and, for every literal, the rules of text that can be stored and of list
# bounds (input_values.py). One tuple, made once: a document's validation is cached
# per text and rules (checked_documents.py).
LIMIT_RULES = (DocumentCost, CheckedLiterals)
__all__ = ["LIMIT_RULES", "MAX_ALIASES", "MAX_FIELDS", "MAX_QUERY_DEPTH", "MAX_TOKENS", "schema"]


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
        # Parsing and validation, cached; long documents off the event loop;
        # one operation; String and ID variables (checked_documents.py).
        DocumentChecks,
    ],
)
