"""Every String and ID a request passes in, held to the rule of text that can be stored.

The rule is service/stored_text.py's; here it is applied at the input
boundary, before anything runs, to every String and ID argument and input
field of every field (root or nested), on both routes:

- literals: by a validation rule (StorableLiterals), so the verdict is kept
  with the document's validation, once per document text;
- variables: by a check compiled once per operation from the variables'
  declared types (InputCheck), run on every request that sends variables
  (service/graphql/checked_documents.py on Strawberry's route, the front
  door on the fast path's, which declines such a request to Strawberry's);
- a lone surrogate written in a literal ("\\ud800") is a syntax error to
  GraphQL's lexer; `located_surrogate` finds which argument it was in, so
  the answer is the same BAD_INPUT as for a variable.

Each refusal is BAD_INPUT with `extensions.field` naming the argument the
way the domain's own refusals do: the argument and the path inside it
(`reason`, `input.nodeId`, `nodeIds[0]`), whether the value came as a literal
or in a variable, and `extensions.value` the bad value as errors.shown
writes it (escaped, a short prefix). An ID is also bounded as a node id is
(MAX_ID_LENGTH), the bound named in the message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from graphql import (
    ArgumentNode,
    ASTValidationRule,
    DocumentNode,
    GraphQLError,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLList,
    GraphQLNamedType,
    GraphQLNonNull,
    GraphQLSchema,
    GraphQLSyntaxError,
    ListValueNode,
    Node,
    ObjectFieldNode,
    OperationDefinitionNode,
    StringValueNode,
    ValidationContext,
    VariableDefinitionNode,
    VariableNode,
    Visitor,
    get_named_type,
    parse,
    type_from_ast,
    visit,
)

from service.errors import InvalidInput
from service.stored_text import id_problem, text_problem

# (where inside the value, the bad text, why)
Problem = tuple[str, str, str]
Check = Callable[[Any], Problem | None]


def _problem_of(type_: GraphQLNamedType | None) -> Callable[[str], str | None] | None:
    """The rule a text in a position of this type must meet; None for positions of no text."""
    if type_ is None:
        return text_problem  # a literal where no type is known: refused by validation anyway
    if type_.name == "ID":
        return id_problem
    if type_.name == "String":
        return text_problem
    return None


def refusal(
    field: str, value: str, problem: str, nodes: Node | Sequence[Node] | None
) -> GraphQLError:
    """The BAD_INPUT of a value that breaks the rule, at `nodes` in the document."""
    refused = InvalidInput(field, value, problem)
    return GraphQLError(
        refused.message, nodes, original_error=refused, extensions=refused.extensions
    )


def value_path(keys: Sequence[Any], chain: Sequence[Any]) -> str:
    """`argument.inputField[index]...` of a value, from a visitor's path and its ancestors and parent.

    Relative to the field (or directive) the argument belongs to, as the
    domain's refusals name fields; a variable's default value is `$name...`.
    """
    parts: list[str] = []
    for i, (container, key) in enumerate(zip(chain, keys, strict=False)):
        if isinstance(container, ArgumentNode):
            parts = [container.name.value]
        elif isinstance(container, VariableDefinitionNode):
            parts = [f"${container.variable.name.value}"]
        elif isinstance(container, ObjectFieldNode):
            parts.append(f".{container.name.value}")
        elif isinstance(key, int) and i > 0 and isinstance(chain[i - 1], ListValueNode):
            parts.append(f"[{key}]")
    return "".join(parts)


class StorableLiterals(ASTValidationRule):
    """A String or ID literal anywhere in the document must be text that can be stored."""

    def enter_string_value(
        self,
        node: StringValueNode,
        key: Any,
        parent: Any,
        path: Sequence[Any],
        ancestors: Sequence[Any],
    ) -> None:
        context = self.context
        assert isinstance(context, ValidationContext)  # the schema's validation, never SDL's
        problem_of = _problem_of(get_named_type(context.get_input_type()))
        if problem_of is None:
            return
        problem = problem_of(node.value)
        if problem is not None:
            field = value_path(path, [*ancestors, parent])
            self.report_error(refusal(field, node.value, problem, node))


# --- variables ------------------------------------------------------------------------


class _Checks:
    """Checks of values of input types, each type's made once."""

    def __init__(self) -> None:
        self._named: dict[str, Check | None] = {}

    def of(self, type_: GraphQLInputType) -> Check | None:
        if isinstance(type_, GraphQLNonNull):
            return self.of(type_.of_type)
        if isinstance(type_, GraphQLList):
            item = self.of(type_.of_type)
            return None if item is None else _listed(item)
        if isinstance(type_, GraphQLInputObjectType):
            return self._input_object(type_)
        problem_of = _problem_of(type_)
        return None if problem_of is None else _text(problem_of)

    def _input_object(self, type_: GraphQLInputObjectType) -> Check | None:
        if type_.name in self._named:
            return self._named[type_.name]
        # A type that holds itself meets its own check while it is being made.
        made: list[Check | None] = []
        self._named[type_.name] = lambda value: made[0](value) if made and made[0] else None
        fields = [(name, self.of(field.type)) for name, field in type_.fields.items()]
        checked = [(name, check) for name, check in fields if check is not None]
        check = _input_object(checked) if checked else None
        made.append(check)
        self._named[type_.name] = check
        return check


def _text(problem_of: Callable[[str], str | None]) -> Check:
    def check(value: Any) -> Problem | None:
        if type(value) is not str:
            return None  # not a text: the type's own coercion refuses it, or takes it
        problem = problem_of(value)
        return None if problem is None else ("", value, problem)

    return check


def _listed(item: Check) -> Check:
    def check(value: Any) -> Problem | None:
        if type(value) is not list:
            return item(value)  # a lone value is coerced as a list of one
        for index, entry in enumerate(value):
            found = item(entry)
            if found is not None:
                return (f"[{index}]{found[0]}", found[1], found[2])
        return None

    return check


def _input_object(fields: list[tuple[str, Check]]) -> Check:
    def check(value: Any) -> Problem | None:
        if type(value) is not dict:
            return None
        for name, field in fields:
            if name in value:
                found = field(value[name])
                if found is not None:
                    return (f".{name}{found[0]}", found[1], found[2])
        return None

    return check


class InputCheck:
    """The rule applied to an operation's variables, compiled from their declared types."""

    def __init__(
        self,
        document: DocumentNode,
        operation: OperationDefinitionNode,
        checks: list[tuple[str, Check]],
    ) -> None:
        self._document = document
        self._operation = operation
        self._checks = checks

    def refusal(self, variables: dict[str, Any] | None) -> GraphQLError | None:
        """The BAD_INPUT of the first variable value that breaks the rule, None when none does."""
        if not variables:
            return None
        for name, check in self._checks:
            if name in variables:
                found = check(variables[name])
                if found is not None:
                    inner, value, problem = found
                    return self._refusal(name, inner, value, problem)
        return None

    def _refusal(self, name: str, inner: str, value: str, problem: str) -> GraphQLError:
        usage = variable_usage(self._document, name)
        field = f"{usage}{inner}" if usage is not None else f"${name}{inner}"
        definition = next(
            (
                d
                for d in self._operation.variable_definitions or ()
                if d.variable.name.value == name
            ),
            None,
        )
        return refusal(field, value, problem, definition)


def compile_input_check(
    schema: GraphQLSchema, document: DocumentNode, operation: OperationDefinitionNode
) -> InputCheck | None:
    """The operation's variables' check; None when no variable can hold a String or an ID."""
    checks = _Checks()
    compiled = []
    for definition in operation.variable_definitions or ():
        declared = type_from_ast(schema, definition.type)
        if declared is None:
            continue  # an unknown type: validation refused the document
        check = checks.of(declared)  # type: ignore[arg-type]
        if check is not None:
            compiled.append((definition.variable.name.value, check))
    return InputCheck(document, operation, compiled) if compiled else None


def variable_usage(document: DocumentNode, name: str) -> str | None:
    """The argument path where the variable `$name` is first used, e.g. `input` or `input.nodeId`."""
    found: list[str] = []

    class Find(Visitor):
        def enter_variable(
            self,
            node: VariableNode,
            key: Any,
            parent: Any,
            path: Sequence[Any],
            ancestors: Sequence[Any],
        ) -> Any:
            if node.name.value != name or isinstance(parent, VariableDefinitionNode):
                return None
            found.append(value_path(path, [*ancestors, parent]))
            return Visitor.BREAK

    visit(document, Find())
    return found[0] if found else None


# --- a lone surrogate in a literal --------------------------------------------------------

# What graphql-core's lexer says of a lone surrogate in a string: escaped
# ("\ud800", "\u{D800}") or written as the character itself.
_SURROGATE_ESCAPE: Final = re.compile(
    r"\\u(?:([dD][89a-fA-F][0-9a-fA-F]{2})|\{0*([dD][89a-fA-F][0-9a-fA-F]{2})\})"
)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# Attempts at reading past surrogates in one document before giving up (the
# parse error then stands as it is).
_MAX_SURROGATES: Final = 16


def _surrogate_at(body: str, position: int) -> re.Match[str] | None:
    return _SURROGATE_ESCAPE.match(body, position) or _SURROGATE.match(body, position)


def _same_width(written: str) -> str:
    """A character of the same written width as `written` ("?" escaped if need be), so every
    position in the document stays where it was."""
    if len(written) == 1:
        return "?"
    if "{" in written:  # written as \u{D800}, maybe with leading zeros
        return "\\u{" + "0" * (len(written) - 6) + "3F}"
    return "\\u003F"


def located_surrogate(error: GraphQLSyntaxError, max_tokens: int | None) -> GraphQLError | None:
    """The BAD_INPUT naming the argument of a literal holding a lone surrogate, for the parse error
    it caused; None when the error is of anything else (it then stands as GraphQL's own)."""
    if error.source is None or not error.positions:
        return None
    body = error.source.body
    first = next(iter(error.positions))
    if _surrogate_at(body, first) is None:
        return None
    # Read past it (and any more), each replaced by a character of the same
    # width, to find which value it is in; the document's other errors are
    # validation's to report once the value is refused.
    text, position = body, first
    for _ in range(_MAX_SURROGATES):
        found = _surrogate_at(text, position)
        if found is None:
            return None
        text = text[: found.start()] + _same_width(found.group()) + text[found.end() :]
        try:
            document = parse(text, max_tokens=max_tokens)
        except GraphQLSyntaxError as again:
            if not again.positions:
                return None
            position = next(iter(again.positions))
            continue
        return _refusal_at(document, first, body)
    return None


def _refusal_at(document: DocumentNode, position: int, body: str) -> GraphQLError | None:
    found: list[GraphQLError] = []

    class Find(Visitor):
        def enter_string_value(
            self,
            node: StringValueNode,
            key: Any,
            parent: Any,
            path: Sequence[Any],
            ancestors: Sequence[Any],
        ) -> Any:
            loc = node.loc
            if loc is None or not loc.start <= position < loc.end:
                return None
            field = value_path(path, [*ancestors, parent])
            written = body[loc.start : loc.end].strip('"')
            problem = (
                "contains a lone surrogate: half of a UTF-16 pair, not a character, which "
                "text cannot hold"
            )
            found.append(refusal(field, written, problem, node))
            return Visitor.BREAK

    visit(document, Find())
    return found[0] if found else None
