"""Every repository path a comment, docstring or document names exists.

A comment that sends the reader to a file for the rule is worse than none
once that file has moved: the reader trusts it and reads the wrong file, or
nothing. This scans the comments, docstrings and SQL strings (a `-- see ...` inside a
statement) of the Python code (service/, agent/, clients/, benchmarks/,
tests/), the Markdown documents (the repository's root and docs/) and the
distributions' pyproject.toml files for repo-relative paths, and fails naming
the file and line of each one that does not exist, so whoever moved the file
fixes the references in the same change.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Where code with comments lives, and the top folders a path may start with.
CODE = ("service", "agent", "clients", "benchmarks", "tests")
TOP = ("service", "agent", "clients", "benchmarks", "tests", "docs", "deploy", "alembic", ".ci")

PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[A-Za-z0-9_./*<>{}$-]*"
    r"[A-Za-z0-9_/*>}])"
)
# What a path written as a pattern or placeholder contains: not one file.
NOT_ONE_FILE = re.compile(r"[<>*{}$]|\.\.\.")


def _docstrings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(first line, text) of each module, class and function docstring."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                yield body[0].lineno, body[0].value.value


# A string constant that is SQL, or part of a statement: one of these words.
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|WHERE|JOIN|VALUES)\b")


def _sql_strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(first line, text) of each string constant that is SQL or a fragment of a statement
    (an f-string's parts included): where a statement's own comments are."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SQL.search(node.value)
        ):
            yield node.lineno, node.value


def _comments(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def texts_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and docstring of a Python file, each line of a document."""
    source = path.read_text()
    if path.suffix != ".py":
        yield from enumerate(source.splitlines(), start=1)
        return
    yield from _comments(source)
    tree = ast.parse(source)
    docstrings = list(_docstrings(tree))
    seen = {text for _, text in docstrings}
    strings = [(first, text) for first, text in _sql_strings(tree) if text not in seen]
    for first, text in docstrings + strings:
        for offset, line in enumerate(text.splitlines()):
            yield first + offset, line


def named_paths(text: str) -> Iterator[str]:
    for match in PATH.finditer(text):
        named = match.group(1).rstrip(".")
        # A URL's path (https://host/docs/...) is not the repository's.
        before = text[: match.start()]
        # A regular expression's (pyproject.toml's `exclude = ["^agent/build/"]`).
        if NOT_ONE_FILE.search(named) or re.search(r"://\S*$", before) or before.endswith("^"):
            continue
        yield named


def made_at_run_time(named: str) -> bool:
    """A folder .gitignore names, filled when the service runs (service/static/vendor/:
    GraphiQL's scripts, fetched on first use): it exists only after that, so whether
    it is on disk depends on which tests ran first, not on the reference."""
    ignored = {
        line.strip().strip("/")
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    return named.strip("/") in ignored


def exists(named: str) -> bool:
    """A file or folder; or a module written without .py, or with an attribute
    (service/web/http_guards.caller: the function caller of that module)."""
    if (ROOT / named).exists() or (ROOT / f"{named}.py").exists() or made_at_run_time(named):
        return True
    folder, _, last = named.rpartition("/")
    module = last.split(".")[0]
    return bool(module) and (ROOT / folder / f"{module}.py").exists()


def scanned_files() -> list[Path]:
    files = [p for top in CODE for p in sorted((ROOT / top).rglob("*.py"))]
    files += sorted(ROOT.glob("*.md"))
    # The distributions' settings: what they package, check and exclude, and why.
    files += [p for p in (ROOT / "pyproject.toml", *ROOT.glob("*/**/pyproject.toml"))]
    if (ROOT / "docs").is_dir():
        # The journal under docs/history/ records files as they were on the
        # day of each entry: a moved file is history there, not a stale link.
        files += [p for p in sorted((ROOT / "docs").rglob("*.md")) if "history" not in p.parts]
    return [p for p in files if ".venv" not in p.parts and "node_modules" not in p.parts]


def missing_paths() -> list[str]:
    missing = []
    for path in scanned_files():
        for line, text in texts_of(path):
            for named in named_paths(text):
                # A document's links are relative to its own folder: docs/index.md
                # names the agent's pages by their paths under docs/.
                beside = path.parent.relative_to(ROOT) / named
                relative = path.suffix in (".md", ".toml")
                if not exists(named) and not (relative and exists(str(beside))):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {named}")
    return missing


def test_every_path_a_comment_or_document_names_exists() -> None:
    missing = missing_paths()
    assert not missing, "paths named in comments, docstrings or documents that do not exist:\n" + (
        "\n".join(missing)
    )


def test_the_scan_finds_paths_in_comments_docstrings_and_documents(tmp_path: Path) -> None:
    """The scan itself: what it reads as a path, and what it leaves alone."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""See service/graphql/schema.py and tests/<dir or file>."""\n'
        "# the rule: service/no/such.py, in service/static/dashboard.*\n"
        'URL = "tests/not/a/comment.py"  # https://example.org/docs/x.md\n'
    )
    assert [(line, list(named_paths(text))) for line, text in texts_of(module)] == [
        (2, ["service/no/such.py"]),
        (3, []),
        (1, ["service/graphql/schema.py"]),
    ]
    document = tmp_path / "d.md"
    document.write_text(
        "Run `benchmarks/floor.py` (its floor_round: benchmarks/floor.floor_round).\n"
    )
    assert [list(named_paths(text)) for _, text in texts_of(document)] == [
        ["benchmarks/floor.py", "benchmarks/floor.floor_round"]
    ]
    assert exists("benchmarks/floor.floor_round") and exists("service/scheduling")
    # A statement's own comments, and a pyproject.toml's lines (a regular expression left alone).
    statements = tmp_path / "s.py"
    # (Written in parts, so that no string of this test is itself SQL naming a path.)
    sql = "SELECT 1  -- the rule: "
    statements.write_text(
        f'PICK = text(\n    "{sql}' + 'service/no/rule.py\\n"\n    "FROM nodes"\n)\n'
        'NAME = "service/' + 'not/sql.py"\n'
    )
    assert [(line, list(named_paths(text))) for line, text in texts_of(statements)] == [
        (2, ["service/no/rule.py"]),
        (3, []),
    ]
    toml = tmp_path / "pyproject.toml"
    toml.write_text('# see service/no/such.py\nexclude = ["^agent/build/"]\n')
    assert [list(named_paths(text)) for _, text in texts_of(toml)] == [["service/no/such.py"], []]
    assert not exists("service/nodes.register_node")  # moved to service/fleet/node_writes.py
