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
from typing import Any

import strawberry
from graphql import ExecutionResult, OperationType, execute
from strawberry.execution.is_awaitable import optimized_is_awaitable

from .compiled_heartbeat import compile_heartbeat
from .context import Context
from .documents import Prepared, PreparedDocuments
from .masking import mask_unexpected


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

    async def execute(
        self,
        prepared: Prepared,
        operation_name: str | None,
        variables: dict[str, Any] | None,
        context: Context,
    ) -> dict[str, Any]:
        """The response body, {"data": ..., "errors": [...]}, as Strawberry would build it."""
        if operation_name not in prepared.compiled:
            operation = prepared.operation(operation_name)
            prepared.compiled[operation_name] = (
                None if operation is None else compile_heartbeat(self._schema, operation)
            )
        compiled = prepared.compiled[operation_name]
        if compiled is not None:
            answer = await compiled.run(variables, context)
            if answer is not None:
                return answer
        outcome = execute(
            self._schema._schema,
            prepared.document,
            context_value=context,
            variable_values=variables,
            operation_name=operation_name,
            # Strawberry's cheaper check, as its own execute passes it.
            is_awaitable=optimized_is_awaitable,  # type: ignore[arg-type]
            executor_class=self._schema.execution_context_class,
        )
        result: ExecutionResult = await outcome if inspect.isawaitable(outcome) else outcome
        body: dict[str, Any] = {"data": result.data}
        if result.errors:
            # Logged before masking, as Strawberry logs them: the log keeps the
            # cause that the client is not shown.
            self._schema.process_errors(result.errors)
            masked = mask_unexpected(result.errors, context.request_id)
            body["errors"] = [error.formatted for error in masked]
        return body
