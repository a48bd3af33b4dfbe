#!/usr/bin/env python3
"""Set up and run, with nothing but Python 3.11+: `python3 dev.py serve` or `python3 dev.py test`.

Creates .venv and installs the project into it (again only when pyproject.toml
changed), then runs the service or the whole test suite. Extra arguments pass
through: `python3 dev.py test -k allocate`, `python3 dev.py serve --port 9000`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed-pyproject"


def ensure_installed() -> None:
    wanted = (ROOT / "pyproject.toml").read_text()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not (BIN / "python").exists():
        print("creating .venv", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    print("installing llmgw-inventory and its test tools into .venv", file=sys.stderr)
    subprocess.run([*pip, "install", "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(wanted)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"serve", "test", "install"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_installed()
    command, rest = argv[0], argv[1:]
    if command == "install":
        return 0
    if command == "serve":
        args = [str(BIN / "llmgw-inventory"), "serve", *rest]
    else:
        args = [str(BIN / "python"), "-m", "pytest", *rest]
    os.chdir(ROOT)
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
