#!/usr/bin/env python3
"""Set up and run, with nothing but Python 3.11+: `python3 dev.py serve` or `python3 dev.py test`.

Creates .venv and installs the project into it (again only when pyproject.toml
changed), then runs the service or the whole test suite. Extra arguments pass
through: `python3 dev.py test -k allocate`, `python3 dev.py serve --port 9000`.

  python3 dev.py test              the whole suite, in parallel workers (pytest-xdist,
                                   one per core, at least two), its wall time and CPU
  python3 dev.py test --fast       the in-process tier only: no test that starts a
                                   process, a container or a browser, and no page-cost
                                   cluster (docs/contributing/development.md, Tiers)
  python3 dev.py test -n 0         the same in this one process (`-n N`: N workers)
  python3 dev.py test --path fast  the in-process stories on one path only (fast or
                                   strawberry); by default each runs on both, and a
                                   seeded family's seeds take the paths in turn

The console scripts the README shows run the same way from a checkout:
  python3 dev.py ctl ...           is  llmgw-inventory ctl ...
  python3 dev.py demo ...          is  llmgw-inventory demo ...
  python3 dev.py migrate ...       is  llmgw-inventory migrate ...
  python3 dev.py reset ...         is  llmgw-inventory reset ...  (deletes serve's embedded data)
  python3 dev.py fetch-assets ...  is  llmgw-inventory fetch-assets ...
  python3 dev.py agent ...         is  llmgw-agent ...
  python3 dev.py install           only sets up .venv: the service, the agent and the
                                   schedulers' client, each editable (then
                                   `. .venv/bin/activate` puts the scripts on PATH)
  python3 dev.py build [DIR]       a wheel of each in dist/ (or DIR): the service's
                                   (llmgw_inventory-*.whl), the agent's
                                   (llmgw_agent-*.whl) and the client's
                                   (llmgw_inventory_client-*.whl)
  python3 dev.py codegen [--check] regenerates the client's typed layer from
                                   schema.graphql (clients/python/codegen/regenerate.py)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed-pyproject"


# The three distributions: the service (./), the node agent (agent/) and the
# schedulers' client (clients/python/), each with its own pyproject.toml and wheel.
PROJECTS = (ROOT, ROOT / "agent", ROOT / "clients" / "python")
DIST = ROOT / "dist"
CODEGEN = ROOT / "clients" / "python" / "codegen" / "regenerate.py"


def installed_from() -> str:
    """What .venv was installed from: every pyproject.toml (a change to one reinstalls)."""
    return "".join((project / "pyproject.toml").read_text() for project in PROJECTS)


def pip() -> list[str]:
    return [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]


def ensure_installed() -> None:
    wanted = installed_from()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not (BIN / "python").exists():
        print("creating .venv", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    subprocess.run([*pip(), "install", "--upgrade", "pip"], check=True)
    print(
        "installing llmgw-inventory, llmgw-agent, llmgw-inventory-client and the test tools"
        " into .venv",
        file=sys.stderr,
    )
    # Editable, both: the checkout's sources are what runs. The service first:
    # replacing a .venv's older llmgw-inventory, which carried llmgw-agent's
    # console script, deletes that script, so the agent's install must come after.
    subprocess.run([*pip(), "install", "-e", f"{ROOT}[dev]"], check=True)
    subprocess.run([*pip(), "install", "-e", str(ROOT / "agent")], check=True)
    # The client with its optional parts: subscriptions (websockets) and trace
    # context (opentelemetry-api, which the service's tracing extra brings too).
    client = ROOT / "clients" / "python"
    subprocess.run([*pip(), "install", "-e", f"{client}[events,tracing]"], check=True)
    # The client's generator, in an environment of its own (its graphql-core is
    # not the service's), so the test that regenerates and compares needs no network.
    subprocess.run([str(BIN / "python"), str(CODEGEN), "--install-only"], check=True)
    STAMP.write_text(wanted)


def build(out: Path) -> int:
    """A wheel of each distribution in `out`: the service's, the agent's and the client's."""
    for project in PROJECTS:
        # setuptools reuses build/ between builds: a module deleted since the
        # last one would still be packed.
        shutil.rmtree(project / "build", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [*pip(), "wheel", "--no-deps", "--wheel-dir", str(out), *map(str, PROJECTS)], check=False
    )
    for project in PROJECTS:
        shutil.rmtree(project / "build", ignore_errors=True)
    if done.returncode != 0:
        return done.returncode
    for wheel in sorted(out.glob("llmgw_*.whl")):
        print(wheel)
    return 0


# dev.py's command -> what it runs in .venv (the rest of the arguments follow).
COMMANDS = {
    # A checkout has no GraphiQL scripts until they are fetched (a wheel carries them).
    "serve": ["llmgw-inventory", "serve", "--fetch-assets"],
    "migrate": ["llmgw-inventory", "migrate"],
    "reset": ["llmgw-inventory", "reset"],
    "fetch-assets": ["llmgw-inventory", "fetch-assets"],
    "ctl": ["llmgw-inventory", "ctl"],
    "demo": ["llmgw-inventory", "demo"],
    "agent": ["llmgw-agent"],
    "test": ["python", "-m", "pytest"],
    "codegen": ["python", str(CODEGEN)],
}


def workers() -> int:
    """One pytest-xdist worker per core, and at least two: the tests that start
    processes spend much of their time waiting on them, not on a core."""
    return max(2, os.cpu_count() or 1)


def test(args: list[str]) -> int:
    """pytest in parallel (unless the arguments say how), then the run's wall time."""
    chosen = any(
        a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n", "--numprocesses="))
        for a in args
    )
    parallel = [] if chosen else ["-n", str(workers())]
    # Tests marked serial or docker (and each page-cost cluster's cases) go to one
    # worker each, one after another (tests/support/tiers.py): --dist loadgroup.
    command = [str(BIN / "python"), "-m", "pytest", *parallel, "--dist", "loadgroup", *args]
    if "no:xdist" in args:
        command.remove("--dist")
        command.remove("loadgroup")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    before = children_cpu()
    started = time.monotonic()
    code = subprocess.run(command, check=False).returncode
    took = time.monotonic() - started
    what = "the in-process tier (--fast)" if "--fast" in args else "the tests"
    loads = ""
    if load is not None:
        loads = f"; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    # CPU says what wall time on a shared machine cannot: whether the suite got
    # cheaper. PostgreSQL's own is printed by pytest (tests/conftest.py).
    cpu = ""
    if before is not None:
        cpu = f"; {children_cpu() - before:.0f} s CPU in pytest and the processes it started"
    print(f"dev.py test: {what} took {took:.0f} s wall time{loads}{cpu}", flush=True)
    return code


def children_cpu() -> float | None:
    """User + system CPU of this process's finished children (theirs included), where known."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {*COMMANDS, "install", "build"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_installed()
    command, rest = argv[0], argv[1:]
    if command == "install":
        return 0
    if command == "build":
        return build(Path(rest[0]) if rest else DIST)
    if command == "test":
        os.chdir(ROOT)
        return test(rest)
    program, *fixed = COMMANDS[command]
    args = [str(BIN / program), *fixed, *rest]
    if command == "serve":
        os.chdir(ROOT)
    # ctl, demo and agent stay where they were called: `--config ./agent.toml` is the caller's path.
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
