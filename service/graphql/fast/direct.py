"""Running an ordinary query or mutation with graphql-core directly, on a prepared document.

Why: measured here (2 cores), Strawberry's HTTP view and `Schema.execute`
spent about 500 us of CPU on a trivial request: eight extension hooks
entered and left per request, a middleware manager, an execution context and
its result objects, against 70 us for graphql-core executing the same cached
document. A heartbeat is that trivial request plus one batched UPDATE, so the
machinery around execution capped the service at a few thousand beats a
second however cheap the database side was made.

What stays the same, because it is the same code: the schema and every
resolver (Strawberry's field resolvers, with their argument conversion and the
RequireRole extension of permissions.py), the execution context class the
schema was built with, the validation rules and token limit (documents.py),
the masking of unexpected errors (masking.py) and the error log. What is left
to Strawberry: everything that is not an ordinary query or mutation of a
document that parsed and validated (parse and validation errors, subscriptions,
unknown operation names), so those answers stay in Strawberry's own words.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

import strawberry
from graphql import DocumentNode, ExecutionResult, OperationDefinitionNode, OperationType, execute
from graphql.pyutils import AwaitableOrValue
from strawberry.execution.is_awaitable import optimized_is_awaitable

from .compiled_heartbeat import compile_heartbeat
from .compiled_page import compile_page
from .context import Context
from .documents import Prepared, PreparedDocuments
from .masking import mask_unexpected
from .variables import Declined, VariablePlan, compile_variables


class CompiledOperation(Protocol):
    async def run(
        self, variables: dict[str, Any] | None, context: Context
    ) -> dict[str, Any] | bytes | None:
        """The response body (or its encoding), or None: graphql-core must answer."""
        ...


def compile_operation(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledOperation | None:
    """What this document compiles to: the agents' heartbeat, a page of nodes, or nothing."""
    return compile_heartbeat(schema, operation) or compile_page(schema, operation)


@dataclass(frozen=True)
class Plan:
    """What is compiled of one operation of a prepared document, once."""

    operation: OperationDefinitionNode
    # A whole answer without graphql-core's executor (heartbeat, page of nodes).
    compiled: CompiledOperation | None
    # The variables' coercion (variables.py), and the document with this
    # operation's variable definitions left out, for the executor to be built
    # on without coercing them again.
    variables: VariablePlan | None
    bare: DocumentNode | None


def plan_operation(
    schema: strawberry.Schema, prepared: Prepared, operation: OperationDefinitionNode
) -> Plan:
    variables = bare = None
    core = schema._schema
    # execute() refuses schemas with @defer/@stream for a single result; the
    # executor built here would not, so such a schema keeps execute().
    if not (core.get_directive("defer") or core.get_directive("stream")):
        variables = compile_variables(core, operation)
    if variables is not None:
        stripped = replace(operation, variable_definitions=())
        bare = DocumentNode(
            definitions=tuple(
                stripped if d is operation else d for d in prepared.document.definitions
            )
        )
    return Plan(operation, compile_operation(schema, operation), variables, bare)


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class DirectExecutor:
    def __init__(self, schema: strawberry.Schema, documents: PreparedDocuments) -> None:
        self._schema = schema
        self._documents = documents

    def prepare(self, query: str, operation_name: str | None) -> Prepared | None:
        """The prepared document when this executor can answer it; None: Strawberry answers."""
        prepared = self._documents.get(query)
        if prepared is None:
            return None
        operation = prepared.operation(operation_name)
        if operation is None or operation.operation == OperationType.SUBSCRIPTION:
            return None
        return prepared

    def _plan(self, prepared: Prepared, operation_name: str | None) -> Plan | None:
        if operation_name not in prepared.compiled:
            operation = prepared.operation(operation_name)
            prepared.compiled[operation_name] = (
                None if operation is None else plan_operation(self._schema, prepared, operation)
            )
        return prepared.compiled[operation_name]

    async def execute(
        self,
        prepared: Prepared,
        operation_name: str | None,
        variables: dict[str, Any] | None,
        context: Context,
    ) -> bytes:
        """The encoded response body, {"data": ..., "errors": [...]}, as Strawberry would build it."""
        plan = self._plan(prepared, operation_name)
        if plan is not None and plan.compiled is not None:
            answer = await plan.compiled.run(variables, context)
            if answer is not None:
                return answer if isinstance(answer, bytes) else encode(answer)
        outcome = self._execute(plan, prepared, operation_name, variables, context)
        result: ExecutionResult = await outcome if inspect.isawaitable(outcome) else outcome
        body: dict[str, Any] = {"data": result.data}
        if result.errors:
            # Logged before masking, as Strawberry logs them: the log keeps the
            # cause that the client is not shown.
            self._schema.process_errors(result.errors)
            masked = mask_unexpected(result.errors, context.request_id)
            body["errors"] = [error.formatted for error in masked]
        return encode(body)

    def _execute(
        self,
        plan: Plan | None,
        prepared: Prepared,
        operation_name: str | None,
        variables: dict[str, Any] | None,
        context: Context,
    ) -> AwaitableOrValue[ExecutionResult]:
        executor_class = self._schema.execution_context_class
        if plan is not None and plan.variables is not None and plan.bare is not None:
            try:
                values = plan.variables.coerce(variables)
            except Declined:
                values = None
            if values is not None:
                # Built on the document without this operation's variable
                # definitions, graphql-core coerces nothing; the operation and
                # the plan's values are then put back as build would have set them.
                executor = executor_class.build(
                    self._schema._schema,
                    plan.bare,
                    context_value=context,
                    operation_name=operation_name,
                    is_awaitable=optimized_is_awaitable,  # type: ignore[arg-type]
                )
                if not isinstance(executor, list):
                    executor.operation = plan.operation
                    executor.variable_values = values
                    return executor.execute_operation()  # type: ignore[return-value]
        return execute(
            self._schema._schema,
            prepared.document,
            context_value=context,
            variable_values=variables,
            operation_name=operation_name,
            # Strawberry's cheaper check, as its own execute passes it.
            is_awaitable=optimized_is_awaitable,  # type: ignore[arg-type]
            executor_class=executor_class,
        )
