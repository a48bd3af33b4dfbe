"""Operations generated from the schema: what a client could send, valid or not.

hypothesis-graphql draws the operation itself (root fields, arguments as
literals, selections with inline fragments on unions), positive or with one
schema violation (Mode.NEGATIVE). It draws no aliases, named fragments,
variables or directives, so `dress` adds them to the drawn document, each
with some probability: the fast path has one code path per such feature
(variable coercion, fragment collection, @skip/@include) and each must answer
as graphql-core does. Some of what it adds is wrong on purpose: a variable
declared with another type, a value of the wrong JSON type, a required
variable left out, an operation name that names nothing.

Argument values come from the seeded cluster's own vocabulary (its node ids,
classes, fabrics, shard and replica ids, weights paths) as often as from
random text, so that queries find data and mutations find something to change
rather than answering NODE_NOT_FOUND every time.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import graphql
from graphql import (
    ArgumentNode,
    BooleanValueNode,
    DirectiveNode,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLInputObjectType,
    GraphQLInputType,
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    NamedTypeNode,
    NameNode,
    ObjectFieldNode,
    ObjectValueNode,
    OperationDefinitionNode,
    SelectionNode,
    SelectionSetNode,
    Undefined,
    ValueNode,
    VariableDefinitionNode,
    VariableNode,
    get_named_type,
    is_input_object_type,
    is_non_null_type,
    value_from_ast_untyped,
)
from hypothesis import strategies as st
from hypothesis_graphql import Mode, from_schema
from hypothesis_graphql import nodes as value_nodes

from benchmarks.equivalence.seed import VOCABULARY

# Which caller sends it: mostly an operator (everything is allowed, so the
# operation itself decides the answer), sometimes a role that is refused.
ROLES = ("operator", "operator", "operator", "operator", "scheduler", "reader", "agent", None)


MISTAKES = (
    "variable of another type",
    "nullable variable in a non-null position",
    "variable left out",
    "variable of the wrong JSON type",
)


BODIES = ("plain", "explicit nulls", "extensions", "variables not an object", "batch")


@dataclass(frozen=True)
class Operation:
    """One HTTP request: the JSON body and who sends it."""

    query: str
    variables: dict[str, Any] | None = None
    operation_name: str | None = None
    role: str | None = "operator"
    # What was done to the drawn document, for a person reading a difference.
    features: tuple[str, ...] = field(default=(), compare=False)
    # How the JSON body is put together (BODIES): the front door decides from it
    # which requests a fast route may see.
    envelope: str = "plain"

    def body(self) -> Any:
        body: dict[str, Any] = {"query": self.query}
        if self.variables is not None:
            body["variables"] = self.variables
        if self.operation_name is not None:
            body["operationName"] = self.operation_name
        if self.envelope == "explicit nulls":
            body.setdefault("variables", None)
            body.setdefault("operationName", None)
        elif self.envelope == "extensions":
            body["extensions"] = {}
        elif self.envelope == "variables not an object":
            body["variables"] = [self.variables]
        elif self.envelope == "batch":
            return [body]
        return body

    def describe(self) -> str:
        return (
            f"role={self.role} envelope={self.envelope} operationName={self.operation_name!r} "
            f"features={list(self.features)}\nquery:\n{self.query}\n"
            f"variables: {json.dumps(self.variables)}"
        )


def _text(words: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(words), st.sampled_from(words), st.text(max_size=12))


def scalar_values() -> dict[str, st.SearchStrategy[ValueNode]]:
    """Literals for the built-in and custom scalars, from the seed's vocabulary and beyond."""
    ints = st.one_of(
        st.integers(min_value=1, max_value=9),
        st.integers(min_value=1, max_value=9),
        st.integers(min_value=-2, max_value=0),
        st.integers(min_value=-(2**31), max_value=2**31 - 1),
    )
    byte_counts = st.one_of(
        st.sampled_from([0, 10**9, 40 * 10**9, 10**12]),
        st.integers(min_value=-(2**64), max_value=2**64),
    )
    times = st.one_of(
        st.sampled_from(["2020-01-01T00:00:00+00:00", "2999-01-01T00:00:00Z", "yesterday"]),
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    )
    return {
        "ID": st.one_of(_text(VOCABULARY.ids).map(value_nodes.String), ints.map(value_nodes.Int)),
        "String": _text(VOCABULARY.strings).map(value_nodes.String),
        "Int": ints.map(value_nodes.Int),
        "Bytes": byte_counts.map(value_nodes.Int),
        "DateTime": times.map(value_nodes.String),
    }


# Root fields a fast route answers, drawn more often (the compiled heartbeat,
# registration and place, the compiled pages, and the questions schedulers ask most).
FAVOURED = ("nodes", "freeGpus", "node", "nodes", "freeGpus", "node") + ("heartbeat",) * 5
FAVOURED += ("registerNode",) * 3 + ("place",) * 7
# Root fields whose compiled route takes only leaves of Node.
LEAVES_ONLY = (["heartbeat"], ["registerNode"])
# Root fields shaped for a compiled route (the compiled place takes inline fragments on
# its union's members).
COMPILED = (*LEAVES_ONLY, ["nodes"], ["freeGpus"], ["node"], ["place"])


def drawn_documents(schema: GraphQLSchema, sdl: str) -> st.SearchStrategy[DocumentNode]:
    """Queries and mutations as hypothesis-graphql draws them: mostly valid, some not.

    Mostly one root field each (half of them drawn evenly, half from the favoured):
    one failing root field of a mutation nulls the whole answer, so documents
    with many would mostly compare two nulls."""
    scalars = scalar_values()

    def keep(document: DocumentNode) -> DocumentNode:
        return document

    def generated(fields: list[str] | None, mode: Mode) -> st.SearchStrategy[DocumentNode]:
        return from_schema(
            sdl, fields=fields, custom_scalars=scalars, print_ast=keep, allow_x00=False, mode=mode
        )

    assert schema.query_type is not None and schema.mutation_type is not None
    roots = sorted(schema.query_type.fields) + sorted(schema.mutation_type.fields)
    # The favoured fields' share does not shrink as the schema grows: drawn
    # from their own list as often as from every root field.
    single = st.one_of(st.sampled_from(roots), st.sampled_from(FAVOURED)).flatmap(
        lambda name: generated([name], Mode.POSITIVE)
    )
    # A violation needs an argument to put it in.
    fields = {**schema.query_type.fields, **schema.mutation_type.fields}
    with_arguments = [name for name in roots if fields[name].args]
    negative = st.sampled_from(with_arguments).flatmap(
        lambda name: generated([name], Mode.NEGATIVE)
    )
    return st.one_of(*[single] * 6, generated(None, Mode.POSITIVE), negative)


class _Dresser:
    """Adds aliases, fragments, variables and directives to one drawn document."""

    def __init__(self, schema: GraphQLSchema, draw: st.DrawFn) -> None:
        self.schema = schema
        self.draw = draw
        self.definitions: list[VariableDefinitionNode] = []
        self.values: dict[str, Any] = {}
        self.fragments: list[FragmentDefinitionNode] = []
        self.features: set[str] = set()
        self.aliases = 0
        # Plain: aliases, variables and __typename only, as the compiled routes take them.
        self.plain = False
        # Hypothesis's integers and its Random lean towards their bounds (0 far more often
        # than 1 in 100); a Random seeded from one draw is uniform and replays all the same.
        self.random = random.Random(draw(st.integers(min_value=0, max_value=2**32 - 1)))
        # At most one mistake per operation, so that most operations are valid and the
        # invalid ones are invalid for one reason.
        self.mistake: str | None = draw(st.sampled_from((None,) * 5 + MISTAKES))

    def chance(self, percent: int) -> bool:
        return self.random.random() * 100 < percent

    # --- variables -----------------------------------------------------------------------

    def variable(self, value: ValueNode, type_: GraphQLInputType) -> ValueNode:
        """The literal, or a variable holding it (sometimes declared or valued wrongly)."""
        if isinstance(value, VariableNode) or not self.chance(35):
            return value
        name = f"v{len(self.definitions)}"
        type_text = str(type_)
        python_value = value_from_ast_untyped(value)
        self.features.add("variables")
        provided = True
        default = None
        mistake = self.mistake
        if mistake is not None:
            self.mistake = None
            self.features.add(mistake)
        if mistake == "variable of another type":
            # graphql-core's validation answers.
            type_text = self.draw(st.sampled_from(["String", "Int!", "[ID!]", "Boolean", "Bytes"]))
        elif mistake == "nullable variable in a non-null position" and is_non_null_type(type_):
            type_text = str(type_.of_type)  # type: ignore[attr-defined]
        elif mistake == "variable left out":
            provided = False
            if self.chance(30):
                default = value
                self.features.add("variable default")
        elif mistake == "variable of the wrong JSON type":
            python_value = self.draw(
                st.sampled_from([None, "seven", 7, 2**40, True, 1.5, [], {}, ["x"], {"a": 1}])
            )
        self.definitions.append(
            VariableDefinitionNode(
                variable=VariableNode(name=NameNode(value=name)),
                type=graphql.parse_type(type_text),
                default_value=default,
                directives=(),
            )
        )
        if provided:
            self.values[name] = python_value
        return VariableNode(name=NameNode(value=name))

    def value(self, value: ValueNode, type_: GraphQLInputType) -> ValueNode:
        named = get_named_type(type_)
        lifted = self.variable(value, type_)
        if lifted is not value:
            return lifted
        if isinstance(value, ObjectValueNode) and is_input_object_type(named):
            assert isinstance(named, GraphQLInputObjectType)
            fields = []
            for object_field in value.fields:
                field_def = named.fields.get(object_field.name.value)
                inner = object_field.value
                if field_def is not None:
                    inner = self.value(inner, field_def.type)
                fields.append(ObjectFieldNode(name=object_field.name, value=inner))
            value = ObjectValueNode(fields=tuple(fields))
        return value

    # --- selections ----------------------------------------------------------------------

    def directives(self) -> tuple[DirectiveNode, ...]:
        if self.plain or not self.chance(12):
            return ()
        self.features.add("directives")
        name = self.draw(st.sampled_from(["include", "skip"]))
        condition: ValueNode = BooleanValueNode(value=self.draw(st.booleans()))
        condition = self.variable(condition, graphql.GraphQLNonNull(graphql.GraphQLBoolean))
        return (
            DirectiveNode(
                name=NameNode(value=name),
                arguments=(ArgumentNode(name=NameNode(value="if"), value=condition),),
            ),
        )

    def field(self, node: FieldNode, parent: GraphQLNamedType) -> FieldNode:
        definition = None
        if isinstance(parent, GraphQLObjectType):
            definition = parent.fields.get(node.name.value)
        arguments = []
        for argument in node.arguments or ():
            arg_def = definition.args.get(argument.name.value) if definition else None
            value = argument.value
            if arg_def is not None:
                value = self.value(value, arg_def.type)
            arguments.append(ArgumentNode(name=argument.name, value=value))
        alias = node.alias
        if alias is None and self.chance(12):
            self.features.add("aliases")
            # Mostly a name of its own; now and then one another field uses, which
            # graphql-core refuses when the two fields differ.
            taken = self.draw(st.sampled_from(["id", "gpus", "state"]))
            alias = NameNode(value=taken if self.chance(10) else f"a{self.aliases}")
            self.aliases += 1
        selection_set = node.selection_set
        if selection_set is not None and definition is not None:
            selection_set = self.selections(selection_set, get_named_type(definition.type))
        directives = tuple(node.directives or ()) + self.directives()
        return FieldNode(
            alias=alias,
            name=node.name,
            arguments=tuple(arguments),
            directives=directives,
            selection_set=selection_set,
        )

    def selections(
        self, selection_set: SelectionSetNode, parent: GraphQLNamedType
    ) -> SelectionSetNode:
        selected: list[SelectionNode] = []
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                selected.append(self.field(selection, parent))
            elif isinstance(selection, InlineFragmentNode):
                on = parent
                if selection.type_condition is not None:
                    on = self.schema.get_type(selection.type_condition.name.value) or parent
                selected.append(
                    InlineFragmentNode(
                        type_condition=selection.type_condition,
                        directives=tuple(selection.directives or ()),
                        selection_set=self.selections(selection.selection_set, on),
                    )
                )
            else:
                selected.append(selection)
        if self.chance(10):
            self.features.add("__typename")
            selected.append(
                FieldNode(name=NameNode(value="__typename"), arguments=(), directives=())
            )
        wrapped = SelectionSetNode(selections=tuple(selected))
        if not self.plain and self.chance(15):
            # The whole selection as a named fragment spread, or an inline
            # fragment without a type condition.
            if self.chance(70):
                self.features.add("named fragments")
                name = f"F{len(self.fragments)}"
                self.fragments.append(
                    FragmentDefinitionNode(
                        name=NameNode(value=name),
                        type_condition=NamedTypeNode(name=NameNode(value=parent.name)),
                        directives=(),
                        selection_set=wrapped,
                    )
                )
                spread: SelectionNode = FragmentSpreadNode(
                    name=NameNode(value=name), directives=self.directives()
                )
            else:
                self.features.add("inline fragments")
                spread = InlineFragmentNode(
                    type_condition=None, directives=self.directives(), selection_set=wrapped
                )
            return SelectionSetNode(selections=(spread,))
        return wrapped


def compiled_shape(
    schema: GraphQLSchema,
    selection_set: SelectionSetNode,
    parent: GraphQLNamedType,
    leaves_only: bool,
) -> SelectionSetNode:
    """The selection without what no compiled route takes: arguments below the root
    (dropped where all are optional, as Node.freeGpus without gpuClass; else the field),
    and (for the heartbeat) anything but leaves. Inline fragments on a union's members
    (place's) are kept, shaped alike."""
    kept: list[SelectionNode] = []
    for selection in selection_set.selections:
        if isinstance(selection, InlineFragmentNode) and selection.type_condition is not None:
            on = schema.get_type(selection.type_condition.name.value)
            if on is not None:
                kept.append(
                    InlineFragmentNode(
                        type_condition=selection.type_condition,
                        directives=(),
                        selection_set=compiled_shape(
                            schema, selection.selection_set, on, leaves_only
                        ),
                    )
                )
            continue
        if not isinstance(selection, FieldNode) or not isinstance(parent, GraphQLObjectType):
            continue
        definition = parent.fields.get(selection.name.value)
        if definition is None:
            continue
        named = get_named_type(definition.type)
        root = parent.name in ("Query", "Mutation")
        required = any(
            is_non_null_type(a.type) and a.default_value is Undefined
            for a in definition.args.values()
        )
        if not root and required:
            continue
        arguments = selection.arguments if root else ()
        if selection.selection_set is None:
            kept.append(
                selection
                if arguments is selection.arguments
                else FieldNode(
                    alias=selection.alias,
                    name=selection.name,
                    arguments=arguments,
                    directives=selection.directives,
                )
            )
        elif root or not leaves_only:
            inner = compiled_shape(schema, selection.selection_set, named, leaves_only and not root)
            if inner.selections:
                kept.append(
                    FieldNode(
                        alias=selection.alias,
                        name=selection.name,
                        arguments=arguments,
                        directives=(),
                        selection_set=inner,
                    )
                )
    if not kept:
        kept.append(FieldNode(name=NameNode(value="__typename"), arguments=(), directives=()))
    return SelectionSetNode(selections=tuple(kept))


@st.composite
def operations(draw: st.DrawFn, schema: GraphQLSchema, sdl: str) -> Operation:
    document = draw(drawn_documents(schema, sdl))
    operation = document.definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    root = (
        schema.mutation_type
        if operation.operation == graphql.OperationType.MUTATION
        else schema.query_type
    )
    assert root is not None
    dresser = _Dresser(schema, draw)
    selection_set = operation.selection_set
    root_fields = [s.name.value for s in selection_set.selections if isinstance(s, FieldNode)]
    if root_fields in COMPILED and dresser.chance(85):
        # Shaped for the compiled routes (the agents' mutations' leaves, a page's
        # or one node's plain fields and lists, a placement's union members), which take
        # only what they can answer whole.
        dresser.plain = True
        dresser.features.add("compiled shape")
        selection_set = compiled_shape(
            schema, selection_set, root, leaves_only=root_fields in LEAVES_ONLY
        )
    if dresser.chance(75):
        selection_set = dresser.selections(selection_set, root)
    name = None
    operation_name = None
    if draw(st.booleans()):
        name = NameNode(value="Generated")
        dresser.features.add("operation name")
        if draw(st.booleans()):
            operation_name = "Generated"
    if dresser.chance(3):
        operation_name = "Missing"
        dresser.features.add("unknown operationName")
    definitions: list[Any] = [
        OperationDefinitionNode(
            operation=operation.operation,
            name=name,
            variable_definitions=tuple(dresser.definitions),
            directives=(),
            selection_set=selection_set,
        ),
        *dresser.fragments,
    ]
    if name is not None and dresser.chance(10):
        # A second operation in the same document: operationName must pick.
        dresser.features.add("two operations")
        definitions.append(
            graphql.parse("query Other { gpuClasses { gpuClass free } }").definitions[0]
        )
    query = graphql.print_ast(DocumentNode(definitions=tuple(definitions)))
    variables = dresser.values if dresser.definitions or draw(st.booleans()) else None
    envelope = dresser.random.choice(BODIES) if dresser.chance(12) else "plain"
    if envelope != "plain":
        dresser.features.add(f"body: {envelope}")
    return Operation(
        envelope=envelope,
        query=query,
        variables=variables,
        operation_name=operation_name,
        role=draw(st.sampled_from(ROLES)),
        features=tuple(sorted(dresser.features)),
    )
