"""The layering the codebase promises, checked on every module under service/ (recursively).

The layers are written down here, once, lowest first: a module imports only
from its own layer or a lower one, and no module imports itself back through
others (a circle), whatever the layers. Only the API and web layers import
the web and GraphQL frameworks; the agent imports nothing from the service.
docs/contributing/layers.md explains each layer, and a test below keeps its
table the same as LAYERS.

Every import counts: at module level, inside a function, or under
TYPE_CHECKING (a type-only import still ties the modules for a reader and for
mypy). A new module must fall in a layer: a top-level module or package not
listed here fails the test until it is placed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("strawberry", "starlette")

# (layer, the modules and packages in it), lowest first.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "service.errors",
            "service.bounds",
            "service.stored_text",
            "service.node_states",
            "service.paging",
            "service.batches",
            "service.tasks",
        ),
    ),
    ("database", ("service.database",)),
    ("configuration", ("service.config",)),
    ("event log", ("service.event_log",)),
    ("scheduling", ("service.scheduling", "service.restores")),
    (
        "schema",
        (
            "service.tables",
            "service.health_tables",
            "service.tenancy_tables",
            "service.maintenance_tables",
            "service.reservation_tables",
        ),
    ),
    ("metrics", ("service.metrics", "service.backup_status")),
    ("fleet", ("service.fleet",)),
    ("access", ("service.access_control", "service.readiness")),
    ("api", ("service.graphql",)),
    ("web", ("service.web",)),
    (
        "commands",
        ("service.cli", "service.ctl", "service.demo_cluster", "service.schema_reference"),
    ),
]
# The layers whose modules may import the web and GraphQL frameworks.
FRAMEWORK_LAYERS = ("api", "web")

# Upward imports known and being removed, each with the reason it is allowed
# for now. An entry whose import no longer exists fails the test: delete it.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def modules_under(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root` (the directory of `package`), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (at `path`) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    targets: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # `from pkg import module` names the module; `from module import name` the module.
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else resolve(base))
    targets.discard(None)
    targets.discard(name)
    return {t for t in targets if t is not None}


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = modules_under(root, package)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    for index, (_, members) in enumerate(layers):
        if any(module == m or module.startswith(m + ".") for m in members):
            return index
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for module, targets in sorted(graph.items()):
        low = layer_of(module)
        for target in sorted(targets):
            high = layer_of(target)
            if low is not None and high is not None and high > low:
                found.append((module, target))
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a circle (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def service_graph() -> dict[str, set[str]]:
    return import_graph(REPO / "service", "service")


def test_every_module_of_the_service_is_in_a_layer() -> None:
    unplaced = [m for m in service_graph() if m != "service" and layer_of(m) is None]
    assert unplaced == [], "add these to LAYERS in tests/tools_and_docs/test_layers.py"


def test_no_module_imports_from_a_higher_layer() -> None:
    names = [name for name, _ in LAYERS]
    found = upward_imports(service_graph())
    stale = sorted(set(KNOWN_UPWARD) - set(found))
    assert stale == [], "these upward imports are gone: delete them from KNOWN_UPWARD"
    upward = [
        f"{source} ({names[layer_of(source) or 0]}) imports {target} "
        f"({names[layer_of(target) or 0]})"
        for source, target in found
        if (source, target) not in KNOWN_UPWARD
    ]
    assert upward == []


def test_no_module_imports_itself_through_others() -> None:
    assert circles(service_graph()) == []


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    # A service in miniature: errors imports the web layer, and two fleet
    # modules import each other (one only for type checking, inside a block).
    root = tmp_path / "service"
    (root / "fleet").mkdir(parents=True)
    (root / "web").mkdir()
    for init in (root, root / "fleet", root / "web"):
        (init / "__init__.py").write_text("")
    (root / "errors.py").write_text("def f():\n    from service.web import app\n")
    (root / "web" / "app.py").write_text("")
    (root / "fleet" / "a.py").write_text("from . import b\n")
    (root / "fleet" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from service.fleet.a import X\n"
    )
    graph = import_graph(root, "service")
    assert upward_imports(graph) == [("service.errors", "service.web.app")]
    assert circles(graph) == [["service.fleet.a", "service.fleet.b"]]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_api_and_web_layers_import_a_web_or_graphql_framework() -> None:
    allowed = {i for i, (name, _) in enumerate(LAYERS) if name in FRAMEWORK_LAYERS}
    modules = modules_under(REPO / "service", "service")
    offenders = {
        name: sorted(m for m in imported_modules(path) if m.split(".")[0] in FRAMEWORKS)
        for name, path in modules.items()
        if layer_of(name) not in allowed
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_agent_imports_nothing_from_the_service() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] == "service"
        )
        for path in sorted((REPO / "agent").rglob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_contributing_page_lists_the_same_layers() -> None:
    # docs/contributing/layers.md's table: | n | layer | modules | ..., lowest first.
    page = (REPO / "docs" / "contributing" / "layers.md").read_text()
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|", page, re.M)
    listed = [
        (name, tuple(re.findall(r"`service/([\w/]+?)(?:\.py|/)`", modules)))
        for _, name, modules in rows
    ]
    expected = [
        (name, tuple(m.removeprefix("service.").replace(".", "/") for m in members))
        for name, members in LAYERS
    ]
    assert listed == expected


def folder_listings(page: str) -> dict[str, list[str]]:
    """Each "`service/<folder>/`:" of the page with the modules its bullet list names."""
    listings: dict[str, list[str]] = {}
    for folder, bullets in re.findall(
        r"^`(service/[\w/]+/)`:\n\n((?:- `[\w.]+\.py`.*\n(?:  .*\n)*)+)", page, flags=re.M
    ):
        listings[folder] = re.findall(r"^- `([\w.]+\.py)`", bullets, flags=re.M)
    return listings


def test_the_contributing_page_lists_each_folder_it_describes_whole() -> None:
    """A folder the page describes module by module lists every module in it, and no other
    (issue 45: placement/fit.py was left out)."""
    listings = folder_listings((REPO / "docs" / "contributing" / "layers.md").read_text())
    assert listings, "the page describes no folder module by module"
    for folder, listed in listings.items():
        present = sorted(p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py")
        assert sorted(listed) == present, folder


def test_the_folder_listings_are_read_as_a_reader_reads_them() -> None:
    page = (
        "`service/x/`:\n\n- `a.py`: one idea;\n  more of it\n- `b.py`: another.\n\nText.\n"
        "`service/y/`:\n\n- `c.py`: alone.\n"
    )
    assert folder_listings(page) == {"service/x/": ["a.py", "b.py"], "service/y/": ["c.py"]}


# A module past this many lines is a prompt to review it, not a reason to split it:
# split by idea, never by size (issue 45: open_remediations.py, 39 lines, existed only
# because remediations.py passed the old hard cap; it is back in remediations.py). A long
# module that still holds one idea is listed in LONG_MODULES with that idea in a sentence, which a reviewer reads;
# the test fails for a long module without an entry, and for an entry whose module is
# no longer long (so the list says what is true).
REVIEW_AT_LINES = 600

LONG_MODULES: dict[str, str] = {
    "service.scheduling.groups.placing": (
        "a group's replicas held or freed all together (placeGroup, scaleGroup, releaseGroup), "
        "in the caller's transaction; preempting for one is groups/preempting.py's"
    ),
    "service.scheduling.placement.preemption": (
        "the victims of one place (or group): the candidates read in the order of victim sets, "
        "the sets drawn and tried (or claimed), the claim that stops them under one lock order"
    ),
    "service.metrics": (
        "the Prometheus exposition: each family the service writes, beside the read it comes "
        "from (backups' and reservations' families are built in their own modules)"
    ),
    "service.scheduling.placement.fit": (
        "fit: how many more replicas of one shape fit, now or at a later instant, by place()'s "
        "planner over the class's pools, counted by the census or surveyed"
    ),
    "service.tables": (
        "the schema of the core tables, each constraint and index beside the columns it keeps "
        "(fleet health's, tenancy's and reservations' tables are modules of their own)"
    ),
    "service.scheduling.placement.claims": (
        "place() and its transactions: the pick that locks, the claim, the waits for busy "
        "nodes and the rounds, and where preemption and reservations enter them"
    ),
    "service.scheduling.placement.statements": (
        "the SQL place() and explain() send, built from one set of fragments; the "
        "builders share their private helpers"
    ),
    "service.scheduling.allocations.allocating": (
        "allocate(): the checks of GPUs a scheduler named (made in the store statement, then "
        "read again to say which failed) and their store; the wording of each refusal is "
        "rejections.py's"
    ),
}


def test_a_module_past_the_review_size_says_which_one_idea_it_holds() -> None:
    long = {
        name
        for name, path in modules_under(REPO / "service", "service").items()
        if len(path.read_text().splitlines()) > REVIEW_AT_LINES
    }
    unexplained = sorted(long - set(LONG_MODULES))
    assert not unexplained, (
        f"{unexplained} passed {REVIEW_AT_LINES} lines: split by idea if it holds more than "
        "one, else add it to LONG_MODULES with the idea it holds"
    )
    assert sorted(set(LONG_MODULES) - long) == [], "no longer long: remove from LONG_MODULES"
