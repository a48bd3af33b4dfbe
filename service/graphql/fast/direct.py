"""The graphql-core route: an ordinary query or mutation executed by graphql-core on a prepared document.

Why: around graphql-core executing a cached document, Strawberry's HTTP
view and `Schema.execute` add several times its cost on a trivial request:
eight extension hooks entered and left per request, a middleware manager, an
execution context and its result objects. A heartbeat is that trivial
request plus one batched UPDATE, so the machinery around execution, not the
database, would bound the service's rate of beats.

What stays the same, because it is the same code: the schema and every
resolver (Strawberry's field resolvers, with their argument conversion and the
RequireRole extension of permissions.py), the execution context class the
schema was built with, the validation rules and token limit (documents.py,
read from the schema's extensions by extensions.py), the masking of
unexpected errors (masking.py) and the error log.

It always answers: every error of a valid document is graphql-core's to word
and it words it here. Variables are coerced by a plan compiled per operation
(variables.py) when the plan takes them; when it declines, graphql-core
coerces them itself (counted as reason `variables_coerced_by_graphql_core`).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import strawberry
from graphql import DocumentNode, ExecutionResult, OperationDefinitionNode, execute
from graphql.pyutils import AwaitableOrValue

from service.graphql.context import Context
from service.graphql.masking import mask_unexpected
from service.graphql.private_api import (
    core_schema,
    executor_for_coerced_variables,
    optimized_is_awaitable,
)

from .documents import Prepared
from .hand_over import HandedOver
from .outcomes import Answered, encode
from .variables import Declined, VariablePlan, compile_variables

VARIABLES_BY_GRAPHQL_CORE = "variables_coerced_by_graphql_core"


class DirectOperation:
    """One operation of a prepared document, as graphql-core executes it."""

    def __init__(
        self,
        schema: strawberry.Schema,
        prepared: Prepared,
        operation: OperationDefinitionNode,
        operation_name: str | None,
    ) -> None:
        self._schema = schema
        self._core = core_schema(schema)
        self._document = prepared.document
        self._operation = operation
        self._operation_name = operation_name
        self._variables: VariablePlan | None = None
        self._bare: DocumentNode | None = None
        # execute() refuses schemas with @defer/@stream for a single result; the
        # executor built here would not, so such a schema keeps execute().
        if not (self._core.get_directive("defer") or self._core.get_directive("stream")):
            self._variables = compile_variables(self._core, operation)
        if self._variables is not None:
            # The document without this operation's variable definitions, for
            # the executor to be built on without coercing them again.
            stripped = replace(operation, variable_definitions=())
            self._bare = DocumentNode(
                definitions=tuple(
                    stripped if d is operation else d for d in prepared.document.definitions
                )
            )

    async def run(
        self,
        variables: dict[str, Any] | None,
        context: Context,
        handed_over: HandedOver | None = None,
    ) -> Answered:
        """The encoded response body, {"data": ..., "errors": [...]}, as Strawberry would build it.

        `handed_over`: the write a compiled route made before it declined,
        which the root field answers from (hand_over.py).
        """
        outcome, reason = self._execute(variables, context, handed_over)
        result: ExecutionResult = await outcome if inspect.isawaitable(outcome) else outcome
        body: dict[str, Any] = {"data": result.data}
        if result.errors:
            # Logged before masking, as Strawberry logs them: the log keeps the
            # cause that the client is not shown.
            self._schema.process_errors(result.errors)
            masked = mask_unexpected(result.errors, context.request_id)
            body["errors"] = [error.formatted for error in masked]
        return Answered(encode(body), reason)

    def _execute(
        self, variables: dict[str, Any] | None, context: Context, root: HandedOver | None
    ) -> tuple[AwaitableOrValue[ExecutionResult], str]:
        executor_class = self._schema.execution_context_class
        if self._variables is not None and self._bare is not None:
            try:
                values = self._variables.coerce(variables)
            except Declined:
                values = None
            if values is not None:
                executor = executor_for_coerced_variables(
                    executor_class,
                    self._core,
                    self._bare,
                    self._operation,
                    self._operation_name,
                    values,
                    context,
                    root,
                )
                if executor is not None:
                    return executor.execute_operation(), ""
        outcome = execute(
            self._core,
            self._document,
            root_value=root,
            context_value=context,
            variable_values=variables,
            operation_name=self._operation_name,
            # Strawberry's cheaper check, as its own execute passes it.
            is_awaitable=optimized_is_awaitable,  # type: ignore[arg-type]
            executor_class=executor_class,
        )
        return outcome, VARIABLES_BY_GRAPHQL_CORE
