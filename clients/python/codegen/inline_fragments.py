"""ariadne-codegen plugin: the documents the client sends carry no named fragment.

The operations (clients/python/operations/) share fragments so that one
Python class stands for one shape (Allocated, Unplaceable...), whichever
operation answered it. The service's compiled routes (place, the nodes and
freeGpus pages: service/graphql/fast/front_door.py) decline documents with
named fragments and hand them to graphql-core, several times slower. So the
text sent writes each spread in place: a spread on the type it is selected on
becomes that fragment's selections; one on a member of a union becomes an
inline fragment (`... on Allocated { ... }`). Both mean exactly what the spread
meant (a fragment applies where its type condition matches), so the answer,
and the classes generated from the fragments, are unchanged.

Runs inside ariadne-codegen's environment (its own graphql-core), loaded by
regenerate.py, never by the client.
"""

from __future__ import annotations

from ariadne_codegen.plugins.base import Plugin
from graphql import (
    DocumentNode,
    ExecutableDefinitionNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLNamedType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionNode,
    SelectionSetNode,
    get_named_type,
    is_object_type,
    parse,
    print_ast,
)


class InlineFragments(Plugin):
    def generate_operation_str(
        self, operation_str: str, operation_definition: ExecutableDefinitionNode
    ) -> str:
        document = parse(operation_str)
        fragments = {
            d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
        }
        (operation,) = (d for d in document.definitions if isinstance(d, OperationDefinitionNode))
        root = _root_type(self.schema, operation.operation)
        inlined = OperationDefinitionNode(
            operation=operation.operation,
            name=operation.name,
            variable_definitions=operation.variable_definitions,
            directives=operation.directives,
            selection_set=_inline(self.schema, root, operation.selection_set, fragments),
        )
        return print_ast(DocumentNode(definitions=(inlined,)))


def _root_type(schema: GraphQLSchema, operation: OperationType) -> GraphQLNamedType:
    root = {
        OperationType.QUERY: schema.query_type,
        OperationType.MUTATION: schema.mutation_type,
        OperationType.SUBSCRIPTION: schema.subscription_type,
    }[operation]
    assert root is not None, f"the schema has no {operation.value} type"
    return root


def _inline(
    schema: GraphQLSchema,
    parent: GraphQLNamedType,
    selection_set: SelectionSetNode,
    fragments: dict[str, FragmentDefinitionNode],
) -> SelectionSetNode:
    selections: list[SelectionNode] = []
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            if selection.selection_set is None:
                selections.append(selection)
                continue
            assert is_object_type(parent), f"a field selected on {parent.name}"
            field = parent.fields[selection.name.value]  # type: ignore[attr-defined]
            inner = get_named_type(field.type)
            selections.append(
                FieldNode(
                    alias=selection.alias,
                    name=selection.name,
                    arguments=selection.arguments,
                    directives=selection.directives,
                    selection_set=_inline(schema, inner, selection.selection_set, fragments),
                )
            )
        elif isinstance(selection, FragmentSpreadNode):
            fragment = fragments[selection.name.value]
            on = schema.get_type(fragment.type_condition.name.value)
            assert on is not None and not selection.directives
            inner_set = _inline(schema, on, fragment.selection_set, fragments)
            if on is parent:
                selections.extend(inner_set.selections)
            else:
                selections.append(
                    InlineFragmentNode(
                        type_condition=fragment.type_condition, selection_set=inner_set
                    )
                )
        else:
            assert isinstance(selection, InlineFragmentNode)
            on = (
                parent
                if selection.type_condition is None
                else schema.get_type(selection.type_condition.name.value)
            )
            assert on is not None
            selections.append(
                InlineFragmentNode(
                    type_condition=selection.type_condition,
                    directives=selection.directives,
                    selection_set=_inline(schema, on, selection.selection_set, fragments),
                )
            )
    return SelectionSetNode(selections=tuple(selections))
