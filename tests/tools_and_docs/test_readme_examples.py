"""Every GraphQL example in the README is valid against the schema: the docs cannot drift from the API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graphql import parse, validate

from service.graphql.schema import schema

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
EXAMPLES = re.findall(r"```graphql\n(.*?)```", README, re.S)


def test_the_readme_has_examples_for_each_scheduler_question() -> None:
    text = "\n".join(EXAMPLES)
    for operation in ("freeGpus", "nodes(filter", "allocate(", "place(", "explainPlacement",
                      "releaseReplica", "gpuClasses", "fabrics"):  # fmt: skip
        assert operation in text, operation


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_each_example_validates_against_the_schema(example: str) -> None:
    for document in re.split(r"\n(?=mutation |query |\{)", example.strip()):
        errors = validate(schema._schema, parse(document))
        assert [e.message for e in errors] == [], document
