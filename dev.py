#!/usr/bin/env python3
"""Set up and run, with nothing but Python 3.11+: `python3 dev.py serve` or `python3 dev.py test`.

Creates .venv and installs the project into it (again only when pyproject.toml
changed), then runs the service or the whole test suite. Extra arguments pass
through: `python3 dev.py test -k allocate`, `python3 dev.py serve --port 9000`.

The console scripts the README shows run the same way from a checkout:
  python3 dev.py ctl ...           is  llmgw-inventory ctl ...
  python3 dev.py demo ...          is  llmgw-inventory demo ...
  python3 dev.py migrate ...       is  llmgw-inventory migrate ...
  python3 dev.py reset ...         is  llmgw-inventory reset ...  (deletes serve's embedded data)
  python3 dev.py fetch-assets ...  is  llmgw-inventory fetch-assets ...
  python3 dev.py agent ...         is  llmgw-agent ...
  python3 dev.py install           only sets up .venv (then `. .venv/bin/activate`
                                   puts both scripts on PATH)
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


# dev.py's command -> what it runs in .venv (the rest of the arguments follow).
COMMANDS = {
    "serve": ["llmgw-inventory", "serve"],
    "migrate": ["llmgw-inventory", "migrate"],
    "reset": ["llmgw-inventory", "reset"],
    "fetch-assets": ["llmgw-inventory", "fetch-assets"],
    "ctl": ["llmgw-inventory", "ctl"],
    "demo": ["llmgw-inventory", "demo"],
    "agent": ["llmgw-agent"],
    "test": ["python", "-m", "pytest"],
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {*COMMANDS, "install"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_installed()
    command, rest = argv[0], argv[1:]
    if command == "install":
        return 0
    program, *fixed = COMMANDS[command]
    args = [str(BIN / program), *fixed, *rest]
    if command in ("serve", "test"):
        os.chdir(ROOT)
    # ctl, demo and agent stay where they were called: `--config ./agent.toml` is the caller's path.
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
