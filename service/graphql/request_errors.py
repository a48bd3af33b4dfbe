"""Errors a request makes before anything runs, each given a code a client can branch on.

graphql-core words them well but codes none of them. Here:

- a document that does not parse: GRAPHQL_PARSE_FAILED;
- a value the schema refuses, in the document or in the variables (a negative
  Bytes, a malformed DateTime, an Int beyond 32 bits, an unknown input field):
  BAD_INPUT, with `field` naming the argument or variable path when it is known;
- any other validation failure (an unknown field, a missing argument):
  GRAPHQL_VALIDATION_FAILED;
- anything else refused before execution (no operation to run): BAD_REQUEST.

Validation errors are told apart where they are made: `CodeValidationErrors`
marks them when Strawberry validates (the direct executor only runs documents
that validated). What is left without a path after that came from coercing
the variables or choosing the operation, on either route, and `give_code`
finishes the job for both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from graphql import (
    DocumentNode,
    GraphQLError,
    GraphQLSyntaxError,
    Node,
    ValueNode,
    VariableDefinitionNode,
    VariableNode,
    Visitor,
    visit,
)
from strawberry.extensions import SchemaExtension

from service.errors import shown

PARSE_FAILED: Final = "GRAPHQL_PARSE_FAILED"
VALIDATION_FAILED: Final = "GRAPHQL_VALIDATION_FAILED"
BAD_INPUT: Final = "BAD_INPUT"
BAD_REQUEST: Final = "BAD_REQUEST"

# The longest message a request's own mistake is answered with. graphql-core
# repeats a refused literal whole ("Int cannot represent non-integer value:
# ..." with the megabyte someone sent); the rest of a message is a sentence.
MAX_MESSAGE_CHARACTERS: Final = 500

# graphql-core's words for a variable's value that did not coerce, with the
# path inside it: "Variable '$input' has invalid value at .gpus[0].index: ...".
_VARIABLE_PATH = re.compile(r"^Variable '\$\w+' has invalid value(?: at )?((?:\.\w+|\[\d+\])*)")


def code_of(error: GraphQLError) -> str | None:
    extensions = error.extensions or {}
    code = extensions.get("code")
    return code if isinstance(code, str) else None


def _coded(error: GraphQLError, code: str, field: str | None) -> None:
    if len(error.message) > MAX_MESSAGE_CHARACTERS:
        # How a message repeats what a caller sent has one rule (errors.shown).
        error.message = shown(error.message, MAX_MESSAGE_CHARACTERS)
    extensions: dict[str, Any] = {"code": code}
    if field is not None:
        extensions["field"] = field
    error.extensions = {**extensions, **(error.extensions or {})}


def give_code(error: GraphQLError) -> GraphQLError:
    """The error with a code, when it is a request's own mistake found before execution."""
    if code_of(error) is not None or error.path is not None:
        return error  # coded already, or a field's error (masking.py decides those)
    if isinstance(error, GraphQLSyntaxError):
        _coded(error, PARSE_FAILED, None)
        return error
    first = error.nodes[0] if error.nodes else None
    if isinstance(first, VariableDefinitionNode):
        match = _VARIABLE_PATH.match(error.message)
        field = f"${first.variable.name.value}{match.group(1) if match else ''}"
        _coded(error, BAD_INPUT, field)
    else:
        _coded(error, BAD_REQUEST, None)
    return error


def _argument_path(document: DocumentNode, target: Node) -> str | None:
    """`field.argument.inputField...` of a value node in the document, e.g. nodes.filter.minFree."""
    found: list[str] = []

    class Find(Visitor):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def enter(self, node: Any, *_: Any) -> Any:
            kind = type(node).__name__
            if kind in ("FieldNode", "ArgumentNode", "ObjectFieldNode"):
                self.names.append(node.name.value)
            if node is target:
                found.append(".".join(self.names))
                return Visitor.BREAK
            return None

        def leave(self, node: Any, *_: Any) -> Any:
            if type(node).__name__ in ("FieldNode", "ArgumentNode", "ObjectFieldNode"):
                self.names.pop()
            return None

    visit(document, Find())
    return found[0] if found else None


def code_validation_errors(errors: list[GraphQLError], document: DocumentNode | None) -> None:
    """Codes for the validator's errors: a refused value is BAD_INPUT, the rest failed validation."""
    for error in errors:
        if code_of(error) is not None:
            continue
        if isinstance(error, GraphQLSyntaxError):
            # The parse's error, answered in validation's place (checked_documents.py).
            _coded(error, PARSE_FAILED, None)
            continue
        first = error.nodes[0] if error.nodes else None
        # A scalar that refuses a literal reports the scalar's own error,
        # without a node (Strawberry's DateTime); a literal of the wrong
        # shape reports the value node.
        if first is None or (isinstance(first, ValueNode) and not isinstance(first, VariableNode)):
            field = None
            if first is not None and document is not None:
                field = _argument_path(document, first)
            _coded(error, BAD_INPUT, field)
        else:
            _coded(error, VALIDATION_FAILED, None)


class CodeValidationErrors(SchemaExtension):
    """Marks validation errors as they are made (Strawberry's route), see code_validation_errors."""

    def on_validate(self) -> Iterator[None]:
        yield
        context = self.execution_context
        if context.pre_execution_errors:
            code_validation_errors(context.pre_execution_errors, context.graphql_document)
