"""Every GraphQL example in the README and docs/ is valid against the schema: the docs cannot drift from the API.

The README's own examples also run, on the demo cluster (test_readme_walkthrough.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graphql import parse, validate

from service.graphql.schema import schema

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
EXAMPLES = [
    (page.relative_to(REPO), example)
    for page in PAGES
    for example in re.findall(r"```graphql\n(.*?)```", page.read_text(), re.S)
]


def test_the_docs_have_examples_for_each_scheduler_question() -> None:
    text = "\n".join(example for _, example in EXAMPLES)
    for operation in ("freeGpus", "nodes(filter", "allocate(", "place(", "explainPlacement",
                      "releaseReplica", "gpuClasses", "fabrics"):  # fmt: skip
        assert operation in text, operation


@pytest.mark.parametrize(
    ("page", "example"), EXAMPLES, ids=[f"{page}-{i}" for i, (page, _) in enumerate(EXAMPLES)]
)
def test_each_example_validates_against_the_schema(page: Path, example: str) -> None:
    for document in re.split(r"\n(?=mutation |query |subscription |\{)", example.strip()):
        errors = validate(schema._schema, parse(document))
        assert [e.message for e in errors] == [], f"{page}: {document}"
