"""Regenerate the client's typed layer from the exported schema: `python3 dev.py codegen`.

ariadne-codegen reads ../../schema.graphql and operations/*.graphql (settings:
[tool.ariadne-codegen] in clients/python/pyproject.toml) and writes
llmgw_inventory_client/generated/. `--check` writes into a temporary folder
instead and compares, file by file: exit 1 naming what differs
(tests/tools_and_docs/test_client_codegen.py runs it, as the schema reference's
test runs its own check).

ariadne-codegen needs graphql-core < 3.3 and the service 3.3, so it cannot be
installed beside the service: it gets an environment of its own,
.venv/ariadne-codegen, with the versions pinned in the client's `codegen`
extra, made by `python3 dev.py install` (`--install-only`), so that the test
needs no network, and again whenever the pins change. Its output is kept as
written, formatted by the ruff it pins; the project's ruff leaves that folder
alone (pyproject.toml says why).

Only the standard library here: any Python 3.11 runs it.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import shutil
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

CLIENT = Path(__file__).resolve().parent.parent
REPO = CLIENT.parent.parent
GENERATED = CLIENT / "llmgw_inventory_client" / "generated"
TOOL_ENV = REPO / ".venv" / "ariadne-codegen"
COMMAND = "python3 dev.py codegen"

# Run with the tool environment's Python, in the client's folder (the
# settings' paths are relative to it), with this folder on the path for the
# inline_fragments plugin: the settings from pyproject.toml, the output
# folder replaced by argv[2].
_GENERATE = """
import sys, toml
from ariadne_codegen.main import client
config = toml.load(sys.argv[1])
config["tool"]["ariadne-codegen"]["target_package_path"] = sys.argv[2]
client(config)
"""


def pinned() -> list[str]:
    """The generator's requirements: the client's `codegen` extra."""
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    requirements: list[str] = project["project"]["optional-dependencies"]["codegen"]
    return requirements


def tool_python() -> Path:
    """The tool environment's Python, made or brought up to the pin first."""
    python = TOOL_ENV / "bin" / "python"
    stamp = TOOL_ENV / ".installed"
    wanted = "\n".join(pinned())
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing {', '.join(pinned())} into {TOOL_ENV}", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(TOOL_ENV)
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", *pinned()],
        check=True,
    )
    stamp.write_text(wanted)
    return python


def generate(into: Path) -> Path:
    """Generate the package into `into`; the folder it wrote (`into`/generated)."""
    python = tool_python()
    done = subprocess.run(
        [str(python), "-c", _GENERATE, str(CLIENT / "pyproject.toml"), str(into)],
        cwd=CLIENT,
        env={"PATH": f"{python.parent}:/usr/bin:/bin", "PYTHONPATH": str(CLIENT / "codegen")},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ariadne-codegen failed:\n{done.stdout}{done.stderr}")
    return into / "generated"


def files(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def differences(expected: Path, committed: Path) -> list[str]:
    """What `committed` would need to become `expected`, one line (or diff) per file."""
    wanted, present = files(expected), files(committed)
    found = [f"missing: {name}" for name in sorted(wanted - present)]
    found += [f"not generated (delete it): {name}" for name in sorted(present - wanted)]
    for name in sorted(wanted & present):
        if not filecmp.cmp(expected / name, committed / name, shallow=False):
            diff = difflib.unified_diff(
                (committed / name).read_text().splitlines(),
                (expected / name).read_text().splitlines(),
                f"committed/{name}",
                f"generated/{name}",
                lineterm="",
                n=1,
            )
            found.append(f"differs: {name}\n" + "\n".join(list(diff)[:40]))
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    parser.add_argument(
        "--install-only",
        action="store_true",
        help="make the generator's environment (if its pins changed) and stop",
    )
    parser.add_argument(
        "--target",
        type=Path,
        default=GENERATED,
        help="the generated folder (default: the client's)",
    )
    args = parser.parse_args(argv)
    if args.install_only:
        tool_python()
        return 0
    with tempfile.TemporaryDirectory(prefix="llmgw-client-codegen-") as scratch:
        fresh = generate(Path(scratch))
        if args.check:
            stale = differences(fresh, args.target)
            if stale:
                print(
                    f"{args.target} is stale: run `{COMMAND}`\n" + "\n".join(stale),
                    file=sys.stderr,
                )
                return 1
            return 0
        shutil.rmtree(args.target, ignore_errors=True)
        shutil.copytree(fresh, args.target)
    print(f"wrote {args.target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
