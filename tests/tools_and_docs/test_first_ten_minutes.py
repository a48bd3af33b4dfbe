"""The commands the README and docs/ show work as a newcomer types them: in a checkout, through dev.py.

The console scripts live in .venv/bin, so the docs' `llmgw-inventory ctl ...`
and `llmgw-agent ...` are typed as `python3 dev.py ctl ...` and
`python3 dev.py agent ...`; every `ctl` line the README and docs/ show parses;
and the README's links to files in the repository lead somewhere (the docs'
links are checked by `mkdocs build --strict`, test_docs_site.py).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.cli import build_parser
from tests.support.dev_venv import REPO, needs_dev_venv
from tests.support.reports import REGISTER, node_input

pytestmark = pytest.mark.process

README = (REPO / "README.md").read_text()
DOCS = "\n".join(page.read_text() for page in sorted((REPO / "docs").rglob("*.md")))


def dev(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "dev.py"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@needs_dev_venv
def test_dev_py_ctl_is_the_operators_cli(live_service: Any) -> None:
    import httpx

    reply = httpx.post(
        live_service.url, json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}}
    )
    assert not reply.json().get("errors"), reply.text
    done = dev("ctl", "nodes", "--url", live_service.url)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert header.startswith("NODE") and row.startswith("gpu-01")


@needs_dev_venv
def test_dev_py_agent_is_the_agent_and_its_dry_run_needs_no_token(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "LLMGW_AGENT_NODE_ID": "laptop-1",
        "LLMGW_AGENT_TOKEN_FILE": str(tmp_path / "not-made-yet.token"),
        "LLMGW_AGENT_CONFIG": str(tmp_path / "none.toml"),
    }
    (tmp_path / "none.toml").write_text("")
    done = dev("agent", "--once", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["id"] == "laptop-1"


def _ctl_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```(?:sh|console)\n(.*?)```", README + DOCS, re.S):
        # A line ending in a backslash goes on on the next, as the shell reads it.
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            line = line.removeprefix("$ ")
            if line.startswith("llmgw-inventory ctl "):
                lines.append(line.split(" #")[0].split(" |")[0].strip())
    return lines


@pytest.mark.parametrize("line", _ctl_lines())
def test_every_ctl_command_in_the_readme_parses(line: str) -> None:
    # Optional parts are shown in brackets: parse the line with all of them.
    words = shlex.split(line.replace("[", "").replace("]", ""))[1:]
    args = build_parser().parse_args(words)
    assert callable(args.handler)


def test_the_readme_has_ctl_lines_to_check() -> None:
    assert len(_ctl_lines()) >= 10


def test_links_into_the_repository_lead_somewhere() -> None:
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", README, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (REPO / path).exists(), f"README links to {target}, which does not exist"
        elif anchor:
            assert anchor in anchors, f"README links to #{anchor}, which no heading makes"


def _anchor(heading: str) -> str:
    """The id GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")
