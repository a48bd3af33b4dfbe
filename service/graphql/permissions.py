"""Which role each root field needs, enforced in one place.

Every root field (query, mutation, subscription) gets its role from the table
below, applied to the merged root types when the schema is built, so a field
an engineer adds is guarded without anyone remembering to decorate it. A field
missing from the table is refused to everyone but operators (fail closed), and
tests/access_control/test_auth.py fails until it gets a row.

Nested fields need no check: they are reachable only through a root field.

check_role is the one gate a root field passes, on every route: Strawberry's
RequireRole calls it, and so does the fast path's front door
(service/graphql/fast/front_door.py) before any compiled route runs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

from strawberry.extensions.field_extension import (
    AsyncExtensionResolver,
    FieldExtension,
    SyncExtensionResolver,
)
from strawberry.types import Info

from service.access_control.auth import (
    GRANTS,
    Forbidden,
    Principal,
    Unauthenticated,
    WrongNode,
    check_node,
)
from service.paging import page_request

log = logging.getLogger(__name__)

# A field needs one role, or any one of several (a tuple).
Roles = str | tuple[str, ...]

# Root type -> GraphQL field name -> the role it needs (see service/access_control/auth.py
# GRANTS for which roles include which). "agent" fields are node-bound: an
# agent token may only name its own node. docs/security/roles.md's table is
# generated from this one (`python -m service.schema_reference`).
#
# The rule the docs state: a reader may call every query (and the events
# subscription), all but `tokens`, which lists the credentials of everyone.
# Issue 44: fitGroup, explainGroupPlacement (and fit, explainPlacement) needed
# the scheduler role, validationsToRun the agent's; each is a read that
# changes nothing and shows nothing a reader cannot read in `nodes` and
# `freeGpus` (a what-if of placement over them; Node.validationsToRun).
ROOT_FIELD_ROLES: dict[str, dict[str, Roles]] = {
    "Query": {
        "node": "reader",
        "nodes": "reader",
        "freeGpus": "reader",
        "fabrics": "reader",
        "gpuClasses": "reader",
        "allocations": "reader",
        "events": "reader",
        # What-ifs of place and placeGroup: they hold nothing and read what
        # nodes and freeGpus show.
        "explainPlacement": "reader",
        "fit": "reader",
        "fitGroup": "reader",
        "explainGroupPlacement": "reader",
        "group": "reader",
        "groups": "reader",
        "tokens": "operator",
        "weightsEvictable": "reader",
        "shardsToMove": "reader",
        "remediations": "reader",
        # What its node should validate now: asked by the node's own agent
        # (node-bound; an agent token reads no nodes), and by anyone who may
        # read the node, which shows the same list (Node.validationsToRun).
        "validationsToRun": ("reader", "agent"),
        "hardwareProfiles": "reader",
        "tenants": "reader",
        "reservations": "reader",
        "reservation": "reader",
        "tenant": "reader",
        "disruptionBudgets": "reader",
        "maintenanceWindows": "reader",
        "maintenanceWindow": "reader",
    },
    "Mutation": {
        "registerNode": "agent",
        "heartbeat": "agent",
        "cordonNode": "operator",
        "drainNode": "operator",
        "uncordonNode": "operator",
        "removeNode": "operator",
        "cordonGpu": "operator",
        "uncordonGpu": "operator",
        "clearGpuHealth": "operator",
        "taintGpus": "operator",
        "untaintGpus": "operator",
        "taintNode": "operator",
        "untaintNode": "operator",
        "startRemediation": "operator",
        "finishRemediation": "operator",
        # The node's own agent, or an operator's tool (operators hold every role).
        "recordValidation": "agent",
        "setHardwareProfile": "operator",
        "removeHardwareProfile": "operator",
        "allocate": "scheduler",
        "place": "scheduler",
        "reserve": "scheduler",
        "releaseReservation": "scheduler",
        "releaseShard": "scheduler",
        "releaseReplica": "scheduler",
        "placeGroup": "scheduler",
        "scaleGroup": "scheduler",
        "releaseGroup": "scheduler",
        "freeHeldShards": "operator",
        "createToken": "operator",
        "revokeToken": "operator",
        "setTenant": "operator",
        "removeTenant": "operator",
        # A scheduler protects its own deployments (a bound token: its tenant's only).
        "setDisruptionBudget": "scheduler",
        "removeDisruptionBudget": "scheduler",
        "scheduleMaintenance": "operator",
        "cancelMaintenance": "operator",
    },
    "Subscription": {
        "events": "reader",
    },
}

# What a field missing from the table needs.
UNLISTED_ROLE = "operator"


def _named_nodes(kwargs: dict[str, Any]) -> Iterator[str]:
    """The node ids a root field's arguments name (python names, after conversion)."""
    for key in ("node_id", "id"):
        if kwargs.get(key) is not None:
            yield str(kwargs[key])
    for value in kwargs.get("node_ids") or ():
        yield str(value)
    given = kwargs.get("input")
    for attr in ("id", "node_id"):
        if given is not None and getattr(given, attr, None) is not None:
            yield str(getattr(given, attr))


def roles_of(needed: Roles) -> tuple[str, ...]:
    """The roles any one of which may call a field that needs `needed`."""
    return (needed,) if isinstance(needed, str) else needed


def check_role(
    role: Roles,
    operation: str,
    principal: Principal | None,
    kwargs: dict[str, Any],
    *,
    max_page_size: int,
    ended: str | None = None,
) -> None:
    """Raise unless `principal` may call `operation` (which needs `role`) with these arguments.

    The gate, in this order: a connection whose token ended since it was
    checked (`ended`, websockets), the caller's token, its role, the node an
    agent may name, and the page size a paged field (one with `first`) may
    ask for. `kwargs` are the field's arguments as its resolver receives them
    (Python names, after Strawberry's conversion).
    """
    if ended:
        raise Unauthenticated(f"{operation}: {ended}")
    if principal is None:
        raise Unauthenticated(f"{operation}: no token was presented on this connection")
    # One role, nearly always: asked without a tuple (a request's path pays for each call).
    if isinstance(role, str):
        if not principal.may(role):
            raise Forbidden(operation, role, principal)
        node_bound = role == "agent"
    else:
        if not any(principal.may(r) for r in role):
            raise Forbidden(operation, " or ".join(role), principal)
        node_bound = "agent" in role
    if node_bound and principal.role == "agent":
        named = list(_named_nodes(kwargs))
        if not named:
            # Fail closed: an agent field that names no node cannot be checked.
            raise WrongNode(operation, principal.node_id or "", "(none named)")
        for node_id in named:
            check_node(operation, principal, node_id)
    if "first" in kwargs:  # a paged field: the resolver's own page rule (service/paging.py)
        page_request(kwargs["first"], max_page_size)


def role_of(type_name: str, field_name: str) -> Roles:
    """The role a root field needs (fields missing from the table: operators only)."""
    return ROOT_FIELD_ROLES.get(type_name, {}).get(field_name, UNLISTED_ROLE)


# The roles, in the order docs/security/roles.md lists them.
ROLE_ORDER = ("reader", "agent", "scheduler", "operator")
_KINDS = (("Query", "queries"), ("Mutation", "mutations"), ("Subscription", "subscriptions"))


def role_table(root_fields: dict[str, list[str]]) -> str:
    """docs/security/roles.md's table, from ROOT_FIELD_ROLES: for each role a field may need,
    who may call such a field (GRANTS) and every root field of the schema that needs it.

    `root_fields`: the schema's root type -> its field names (the exported
    schema's, so the table lists what clients can call).
    """
    needs: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for type_name, fields in root_fields.items():
        for field in sorted(fields):
            group = needs.setdefault(roles_of(role_of(type_name, field)), {})
            group.setdefault(type_name, []).append(field)

    def rank(roles: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(ROLE_ORDER.index(r) for r in roles)

    lines = ["| a field that needs | may be called by | fields |", "| --- | --- | --- |"]
    for roles in sorted(needs, key=rank):
        callers = []
        for caller in ROLE_ORDER:
            if any(r in GRANTS[caller] for r in roles):
                bound = caller == "agent" and "agent" in roles
                callers.append(f"`{caller}`" + (" (its own node only)" if bound else ""))
        listed = "; ".join(
            f"{words}: " + ", ".join(f"`{f}`" for f in needs[roles][kind])
            for kind, words in _KINDS
            if kind in needs[roles]
        )
        needed = " or ".join(f"`{r}`" for r in roles)
        lines.append(f"| {needed} | {', '.join(callers)} | {listed} |")
    return "\n".join(lines) + "\n"


class RequireRole(FieldExtension):
    """Refuses a root field to callers whose role does not include `role` (one of, for a tuple)."""

    def __init__(self, role: Roles) -> None:
        self.role = role

    def check(self, info: Info[Any, Any], kwargs: dict[str, Any]) -> None:
        context = info.context
        check_role(
            self.role,
            info.field_name,
            getattr(context, "principal", None),
            kwargs,
            max_page_size=context.settings.max_page_size,
            # a websocket whose token was revoked or expired since it connected
            ended=getattr(context, "token_ended", None),
        )

    def resolve(
        self, next_: SyncExtensionResolver, source: Any, info: Info[Any, Any], **kwargs: Any
    ) -> Any:
        self.check(info, kwargs)
        return next_(source, info, **kwargs)

    async def resolve_async(
        self, next_: AsyncExtensionResolver, source: Any, info: Info[Any, Any], **kwargs: Any
    ) -> Any:
        self.check(info, kwargs)
        result = next_(source, info, **kwargs)
        if inspect.isasyncgen(result):  # a subscription's stream
            return result
        return await result


def unlisted_fields(root_types: dict[str, type | None]) -> list[str]:
    """Root fields that have no row in ROOT_FIELD_ROLES, as Type.field."""
    missing = []
    for type_name, root in root_types.items():
        if root is None:
            continue
        roles = ROOT_FIELD_ROLES.get(type_name, {})
        for field in root.__strawberry_definition__.fields:  # type: ignore[attr-defined]
            name = field.graphql_name or _camel(field.python_name)
            if name not in roles:
                missing.append(f"{type_name}.{name}")
    return missing


def guard_root_fields(type_name: str, root: type) -> None:
    """Attach RequireRole to every field of a root type, from the table."""
    roles = ROOT_FIELD_ROLES.get(type_name, {})
    for field in root.__strawberry_definition__.fields:  # type: ignore[attr-defined]
        name = field.graphql_name or _camel(field.python_name)
        role = roles.get(name)
        if role is None:
            log.warning("%s.%s has no role in ROOT_FIELD_ROLES; only operators may call it",
                        type_name, name)  # fmt: skip
            role = UNLISTED_ROLE
        if not any(isinstance(e, RequireRole) for e in field.extensions):
            field.extensions.insert(0, RequireRole(role))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)
