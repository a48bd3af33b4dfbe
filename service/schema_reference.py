"""The schema reference page, generated from the exported schema (schema.graphql), and the role table.

`python -m service.schema_reference` writes docs/reference/schema.md: every root
field (queries, mutations, subscriptions) with its arguments, then every type,
each with the description the schema carries. It also writes the table of
docs/security/roles.md (between its markers): which role each root field of
the exported schema needs, from the one table the service enforces
(service/graphql/permissions.py, ROOT_FIELD_ROLES). `--check` exits 1 when
either is not what the schema and the table would give (a test runs the same
comparison), so neither page can drift from the API it documents.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphql import (
    GraphQLArgument,
    GraphQLEnumType,
    GraphQLField,
    GraphQLInputField,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLSchema,
    GraphQLUnionType,
    build_schema,
    print_ast,
)
from graphql.utilities import ast_from_value

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schema.graphql"
PAGE = REPO / "docs" / "reference" / "schema.md"
ROLES_PAGE = REPO / "docs" / "security" / "roles.md"
ROLES_BEGIN = (
    "<!-- The table below is generated from service/graphql/permissions.py ROOT_FIELD_ROLES "
    "by `python -m service.schema_reference`; a test fails when it is stale. -->"
)
ROLES_END = "<!-- End of the generated table. -->"
COMMAND = "python -m service.schema_reference"


def _text(description: str | None) -> str:
    # One line: a description's own line breaks would end the Markdown list item.
    return " ".join((description or "").split())


def _anchor(name: str) -> str:
    return name.lower()


def _type_link(type_: object) -> str:
    """`[Node!]!` with the named type linked to its section."""
    shown = str(type_)
    named = shown.strip("[]!")
    return shown.replace(named, f"[{named}](#{_anchor(named)})", 1)


def _default(argument: GraphQLArgument | GraphQLInputField) -> str:
    if argument.default_value is None or argument.type is None:
        return ""
    from graphql.pyutils import Undefined

    if argument.default_value is Undefined:
        return ""
    node = ast_from_value(argument.default_value, argument.type)
    return f" = `{print_ast(node)}`" if node is not None else ""


def _arguments(arguments: dict[str, GraphQLArgument]) -> list[str]:
    lines = []
    for name, argument in arguments.items():
        about = _text(argument.description)
        lines.append(
            f"    - `{name}`: {_type_link(argument.type)}{_default(argument)}"
            + (f": {about}" if about else "")
        )
    return lines


def _field(name: str, field: GraphQLField | GraphQLInputField) -> list[str]:
    about = _text(field.description)
    extra = ""
    if isinstance(field, GraphQLInputField):
        extra = _default(field)
    deprecated = getattr(field, "deprecation_reason", None)
    lines = [
        f"- **`{name}`**: {_type_link(field.type)}{extra}"
        + (f"<br>{about}" if about else "")
        + (f" *Deprecated: {deprecated}*" if deprecated else "")
    ]
    if isinstance(field, GraphQLField) and field.args:
        lines.extend(_arguments(field.args))
    return lines


def _named(type_: GraphQLNamedType) -> list[str]:
    lines = [f"### {type_.name}", ""]
    about = _text(type_.description)
    if about:
        lines.extend([about, ""])
    if isinstance(type_, GraphQLObjectType | GraphQLInterfaceType | GraphQLInputObjectType):
        for name, field in type_.fields.items():
            lines.extend(_field(name, field))
    elif isinstance(type_, GraphQLEnumType):
        for name, value in type_.values.items():
            said = _text(value.description)
            lines.append(f"- `{name}`" + (f": {said}" if said else ""))
    elif isinstance(type_, GraphQLUnionType):
        lines.append("One of: " + ", ".join(f"[{t.name}](#{_anchor(t.name)})" for t in type_.types))
    elif isinstance(type_, GraphQLScalarType) and not about:
        lines.append("A scalar.")
    lines.append("")
    return lines


KINDS: tuple[tuple[str, type], ...] = (
    ("Objects", GraphQLObjectType),
    ("Interfaces", GraphQLInterfaceType),
    ("Unions", GraphQLUnionType),
    ("Input objects", GraphQLInputObjectType),
    ("Enums", GraphQLEnumType),
    ("Scalars", GraphQLScalarType),
)


def reference(schema: GraphQLSchema) -> str:
    """The reference page's Markdown for `schema`."""
    lines = [
        "# Schema reference",
        "",
        f"<!-- Generated from schema.graphql by `{COMMAND}`; a test fails when it is stale. -->",
        "",
        "Every operation and type of the GraphQL API, with the descriptions the schema "
        "carries. Generated from the exported schema (`schema.graphql` at the repository's "
        f"root) by `{COMMAND}`.",
        "",
    ]
    roots = [
        ("Queries", schema.query_type),
        ("Mutations", schema.mutation_type),
        ("Subscriptions", schema.subscription_type),
    ]
    root_names = {root.name for _, root in roots if root is not None}
    for title, root in roots:
        if root is None:
            continue
        lines.extend([f"## {title}", ""])
        for name, field in root.fields.items():
            lines.extend(_field(name, field))
        lines.append("")
    named = [
        t
        for name, t in sorted(schema.type_map.items())
        if not name.startswith("__") and name not in root_names
    ]
    for title, kind in KINDS:
        members = [t for t in named if isinstance(t, kind)]
        if not members:
            continue
        lines.extend([f"## {title}", ""])
        for type_ in members:
            lines.extend(_named(type_))
    return "\n".join(lines).rstrip() + "\n"


def roles(schema: GraphQLSchema, page: str) -> str:
    """`page` (docs/security/roles.md) with its generated table made from the role table."""
    from service.graphql.permissions import role_table

    root_fields = {
        root.name: list(root.fields)
        for root in (schema.query_type, schema.mutation_type, schema.subscription_type)
        if root is not None
    }
    before, found, rest = page.partition(ROLES_BEGIN)
    _, ended, after = rest.partition(ROLES_END)
    if not found or not ended:
        raise ValueError(f"{ROLES_PAGE} has lost its markers: {ROLES_BEGIN} ... {ROLES_END}")
    return f"{before}{ROLES_BEGIN}\n\n{role_table(root_fields)}\n{ROLES_END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    parser.add_argument("--output", default=str(PAGE), help=f"the page (default {PAGE})")
    parser.add_argument(
        "--roles", default=str(ROLES_PAGE), help=f"the role page (default {ROLES_PAGE})"
    )
    args = parser.parse_args(argv)
    schema = build_schema(SCHEMA.read_text())
    page, role_page = Path(args.output), Path(args.roles)
    pages = [(page, reference(schema)), (role_page, roles(schema, role_page.read_text()))]
    if args.check:
        stale = [path for path, wanted in pages if not path.exists() or path.read_text() != wanted]
        for path in stale:
            print(f"{path} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path, wanted in pages:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
