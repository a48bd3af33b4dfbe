"""What a module imports, read from its source (the fast path's and the layers' checks)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def _module_imports(path: Path) -> set[str]:
    """The service modules a module imports when it is loaded (TYPE_CHECKING blocks aside)."""
    package = ".".join(path.relative_to(SERVICE.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        package += ".__init__"
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level)[0]
                module = f"{base}.{node.module}" if node.module else base
                if not node.module:
                    found.update(f"{base}.{a.name}" for a in node.names)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("service")}
