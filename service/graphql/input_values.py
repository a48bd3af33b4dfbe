"""Every value a request passes in, held at the input boundary before anything is coerced or runs.

Two rules, applied in one walk to every argument and input field of every
field (root or nested), on both routes:

- text that can be stored (service/stored_text.py's rule), for every String
  and ID; an ID is also bounded as a node id is (MAX_ID_LENGTH), the bound
  named in the message;
- a list no longer than its bound (list_bounds.py's table), its length read
  before any of its entries: an oversized list costs its length, never a
  walk or a coercion of its entries (issue 44: a 1 MiB registerNode listing
  9,000 GPUs was coerced on the event loop before the domain refused it).

Where:

- literals: by a validation rule (CheckedLiterals), so the verdict is kept
  with the document's validation, once per document text; a variable's
  default value is a literal too, bounded as the positions it is used in;
- variables: by a check compiled once per operation (InputCheck) from the
  variables' declared types and the positions they are used in (a list
  variable takes the tightest bound among them), run on the raw JSON values
  of every request that sends variables, before graphql-core coerces them
  (service/graphql/checked_documents.py on Strawberry's route, the front
  door on the fast path's, which declines such a request to Strawberry's);
  it visits only what the types declare, each value at most once;
- a lone surrogate written in a literal ("\\ud800") is a syntax error to
  GraphQL's lexer; `located_surrogate` finds which argument it was in, so
  the answer is the same BAD_INPUT as for a variable.

Each refusal is BAD_INPUT with `extensions.field` naming the argument the
way the domain's own refusals do: the argument and the path inside it
(`reason`, `input.nodeId`, `nodeIds[0]`), whether the value came as a literal
or in a variable. A text's `extensions.value` is the bad value as
errors.shown writes it (escaped, a short prefix); a list's says its length,
with `extensions.length` and `extensions.bound` (errors.TooManyEntries).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    TypeInfo,
    TypeInfoVisitor,
    ValidationContext,
    VariableDefinitionNode,
    VariableNode,
    Visitor,
    get_named_type,
    parse,
    type_from_ast,
    visit,
)
from graphql.validation import ASTValidationContext

from service.errors import InvalidInput, TooManyEntries
from service.stored_text import id_problem, text_problem

from .list_bounds import ListBounds, list_bounds

# (where inside the value, the refusal made from the field's name)
Problem = tuple[str, Callable[[str], InvalidInput]]
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


def _error(refused: InvalidInput, nodes: Node | Sequence[Node] | None) -> GraphQLError:
    """The BAD_INPUT of a value that breaks a rule, at `nodes` in the document."""
    return GraphQLError(
        refused.message, nodes, original_error=refused, extensions=refused.extensions
    )


def refusal(
    field: str, value: str, problem: str, nodes: Node | Sequence[Node] | None
) -> GraphQLError:
    """The BAD_INPUT of a text that breaks the rule, at `nodes` in the document."""
    return _error(InvalidInput(field, value, problem), nodes)


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


# --- where a variable lands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """Where a variable is used: the argument path a refusal names, and its tightest list bound."""

    path: str
    bound: int | None


class _Usages(Visitor):
    def __init__(self, type_info: TypeInfo, bounds: ListBounds, found: dict[str, Usage]) -> None:
        super().__init__()
        self._type_info = type_info
        self._bounds = bounds
        self._found = found

    def enter_variable_definition(self, *_: Any) -> Any:
        return Visitor.SKIP

    def enter_variable(
        self,
        node: VariableNode,
        key: Any,
        parent: Any,
        path: Sequence[Any],
        ancestors: Sequence[Any],
    ) -> None:
        bound = None
        if isinstance(parent, ArgumentNode):
            bound = self._bounds.of(self._type_info.get_argument())
        elif isinstance(parent, ObjectFieldNode):
            owner = get_named_type(self._type_info.get_parent_input_type())
            if isinstance(owner, GraphQLInputObjectType):
                bound = self._bounds.of(owner.fields.get(parent.name.value))
        name = node.name.value
        known = self._found.get(name)
        if known is None or (bound is not None and (known.bound is None or bound < known.bound)):
            self._found[name] = Usage(value_path(path, [*ancestors, parent]), bound)


def variable_usages(
    schema: GraphQLSchema, document: DocumentNode, operation: OperationDefinitionNode
) -> dict[str, Usage]:
    """Each variable of the operation by name: where it is used first, or, when it fills a list,
    where its bound is tightest (in the operation and every fragment it spreads)."""
    found: dict[str, Usage] = {}
    bounds = list_bounds(schema)
    fragments = ASTValidationContext(document, lambda _: None).get_recursively_referenced_fragments(
        operation
    )
    for root in (operation, *fragments):
        type_info = TypeInfo(schema)
        visit(root, TypeInfoVisitor(type_info, _Usages(type_info, bounds, found)))
    return found


# --- literals -----------------------------------------------------------------------------


class CheckedLiterals(ASTValidationRule):
    """A String or ID literal must be text that can be stored; a list literal, no longer than
    its bound."""

    context: ValidationContext  # the schema's validation, never SDL's

    def __init__(self, context: ValidationContext) -> None:
        super().__init__(context)
        self._bounds = list_bounds(context.schema)
        # The input field each object field of a literal fills, by the node's identity.
        self._filled: dict[int, Any] = {}
        self._usages: dict[int, dict[str, Usage]] = {}

    def enter_string_value(
        self,
        node: StringValueNode,
        key: Any,
        parent: Any,
        path: Sequence[Any],
        ancestors: Sequence[Any],
    ) -> None:
        problem_of = _problem_of(get_named_type(self.context.get_input_type()))
        if problem_of is None:
            return
        problem = problem_of(node.value)
        if problem is not None:
            field = value_path(path, [*ancestors, parent])
            self.report_error(refusal(field, node.value, problem, node))

    def enter_object_field(self, node: ObjectFieldNode, *_: Any) -> None:
        owner = get_named_type(self.context.get_parent_input_type())
        if isinstance(owner, GraphQLInputObjectType):
            self._filled[id(node)] = owner.fields.get(node.name.value)

    def enter_list_value(
        self,
        node: ListValueNode,
        key: Any,
        parent: Any,
        path: Sequence[Any],
        ancestors: Sequence[Any],
    ) -> None:
        bound = self._bound_at(parent, ancestors)
        if bound is not None and len(node.values) > bound:
            field = value_path(path, [*ancestors, parent])
            self.report_error(_error(TooManyEntries(field, len(node.values), bound), node))

    def _bound_at(self, parent: Any, ancestors: Sequence[Any]) -> int | None:
        if isinstance(parent, ArgumentNode):
            return self._bounds.of(self.context.get_argument())
        if isinstance(parent, ObjectFieldNode):
            return self._bounds.of(self._filled.get(id(parent)))
        if isinstance(parent, VariableDefinitionNode):  # a default value
            operation = next(
                (a for a in reversed(ancestors) if isinstance(a, OperationDefinitionNode)), None
            )
            if operation is None:
                return None
            if id(operation) not in self._usages:
                self._usages[id(operation)] = variable_usages(
                    self.context.schema, self.context.document, operation
                )
            usage = self._usages[id(operation)].get(parent.variable.name.value)
            return None if usage is None else usage.bound
        return None


# --- variables ------------------------------------------------------------------------


class _Checks:
    """Checks of raw values of input types, each input object type's made once."""

    def __init__(self, bounds: ListBounds) -> None:
        self._bounds = bounds
        self._named: dict[str, Check | None] = {}

    def of(self, type_: GraphQLInputType, bound: int | None = None) -> Check | None:
        """The check of a value of the type; `bound`: the list's, when the type is a list."""
        if isinstance(type_, GraphQLNonNull):
            return self.of(type_.of_type, bound)
        if isinstance(type_, GraphQLList):
            item = self.of(type_.of_type, bound)
            return None if item is None and bound is None else _listed(item, bound)
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
        fields = [
            (name, self.of(field.type, self._bounds.of(field)))
            for name, field in type_.fields.items()
        ]
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
        if problem is None:
            return None
        return "", lambda field: InvalidInput(field, value, problem)

    return check


def _listed(item: Check | None, bound: int | None) -> Check:
    def check(value: Any) -> Problem | None:
        if type(value) is not list:
            # A lone value is coerced as a list of one.
            return None if item is None else item(value)
        length = len(value)
        if bound is not None and length > bound:
            return "", lambda field: TooManyEntries(field, length, bound)
        if item is None:
            return None
        for index, entry in enumerate(value):
            found = item(entry)
            if found is not None:
                return f"[{index}]{found[0]}", found[1]
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
                    return f".{name}{found[0]}", found[1]
        return None

    return check


@dataclass(frozen=True, slots=True)
class _Variable:
    name: str
    check: Check
    path: str  # the argument path a refusal names (Usage.path)
    definition: VariableDefinitionNode


class InputCheck:
    """The rules applied to an operation's raw variable values, compiled once per operation."""

    def __init__(self, variables: list[_Variable]) -> None:
        self._variables = variables

    def refusal(self, variables: dict[str, Any] | None) -> GraphQLError | None:
        """The BAD_INPUT of the first variable value that breaks a rule, None when none does."""
        if not variables:
            return None
        for variable in self._variables:
            if variable.name in variables:
                found = variable.check(variables[variable.name])
                if found is not None:
                    inner, make = found
                    return _error(make(f"{variable.path}{inner}"), variable.definition)
        return None


def compile_input_check(
    schema: GraphQLSchema, document: DocumentNode, operation: OperationDefinitionNode
) -> InputCheck | None:
    """The operation's variables' check; None when no variable can hold a text or a list."""
    usages = variable_usages(schema, document, operation)
    checks = _Checks(list_bounds(schema))
    compiled = []
    for definition in operation.variable_definitions or ():
        declared = type_from_ast(schema, definition.type)
        if declared is None:
            continue  # an unknown type: validation refused the document
        name = definition.variable.name.value
        usage = usages.get(name)
        check = checks.of(declared, None if usage is None else usage.bound)  # type: ignore[arg-type]
        if check is not None:
            path = f"${name}" if usage is None else usage.path
            compiled.append(_Variable(name, check, path, definition))
    return InputCheck(compiled) if compiled else None


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
