"""Lint every migration with squawk (`squawk-cli`), as CI does: `python alembic/squawk_lint.py`.

Each revision's SQL is rendered by alembic's offline mode (`alembic upgrade
<down>:<rev> --sql`, with env.py's lock_timeout at its top) and handed to
squawk, which flags statements that lock or rewrite a busy table (an index
built without CONCURRENTLY, a column added with a volatile default, a NOT
NULL added by a full scan...). docs/deployment/upgrades.md says which
statements a release may run.

An exception is written next to its migration, with its reason: a file
`<migration>.squawk.toml` beside `<migration>.py`,

    [exceptions]
    require-concurrent-index-creation = "taints holds a few rows per faulty GPU; ..."

Every reason must be non-empty, and every exception must still be needed
(an exception for a rule that no longer fires is an error: it would hide the
next statement that breaks it). The rules in GLOBAL are off everywhere, each
for the reason given.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command

HERE = Path(__file__).resolve().parent

GLOBAL = {
    # env.py sets no statement_timeout: a CONCURRENTLY build or a batched backfill may
    # rightly take long, and it is the locks a statement waits for and holds that the
    # hot path feels; lock_timeout (set by env.py, rendered at each file's top) bounds
    # the wait, the other rules catch the holding.
    "require-statement-timeout": "bounded by lock_timeout and the rules on what is held",
    # Rendered files have a transaction per migration; the rule would ask each to
    # set its own timeout inside it, where env.py's session setting already holds.
    "require-timeout-settings": "env.py's session lock_timeout covers every transaction",
    # Style, not locking: a column's type is tables.py's decision (and ints are the
    # GraphQL contract's Int); none of these locks or rewrites a busy table.
    "prefer-bigint-over-int": "a column's type is the schema's decision, not a lock",
    "prefer-identity": "serial ids are the schema's decision, not a lock",
    "prefer-text-field": "a varchar limit is the schema's decision, not a lock",
}


def rendered(config: Config, down: str | None, revision: str) -> str:
    out = io.StringIO()
    config.output_buffer = out
    command.upgrade(config, f"{down}:{revision}" if down else revision, sql=True)
    return out.getvalue()


def exceptions_of(path: Path) -> dict[str, str]:
    beside = path.with_name(path.stem + ".squawk.toml")
    if not beside.exists():
        return {}
    found = tomllib.loads(beside.read_text()).get("exceptions", {})
    return {str(rule): str(reason) for rule, reason in found.items()}


def squawk_findings(sql_path: Path) -> list[dict[str, object]]:
    squawk = shutil.which("squawk") or str(Path(sys.executable).parent / "squawk")
    done = subprocess.run(
        [squawk, "--reporter", "json", "--pg-version", "15.0", str(sql_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"squawk failed on {sql_path}: {done.stderr or done.stdout}")
    findings: list[dict[str, object]] = json.loads(done.stdout)
    return findings


def lint(database_url: str = "postgresql://lint@localhost/lint") -> list[str]:
    """Every problem found, in words; empty when every migration passes."""
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["database_url"] = database_url
    scripts = ScriptDirectory.from_config(config)
    problems = []
    with tempfile.TemporaryDirectory(prefix="squawk-") as folder:
        for script in reversed(list(scripts.walk_revisions())):
            path = Path(script.path)
            down = script.down_revision
            assert down is None or isinstance(down, str), f"{path.name}: merges are not linted"
            sql_path = Path(folder) / f"{script.revision}.sql"
            sql_path.write_text(rendered(config, down, script.revision))
            allowed = exceptions_of(path)
            for rule, reason in allowed.items():
                if not reason.strip():
                    problems.append(f"{path.name}: the exception for {rule} gives no reason")
            fired = set()
            for finding in squawk_findings(sql_path):
                rule = str(finding["rule_name"])
                if rule in GLOBAL:
                    continue
                fired.add(rule)
                if rule not in allowed:
                    problems.append(
                        f"{path.name}: {rule}: {finding['message']} (rendered line "
                        f"{finding['line']}; {finding.get('help', '')})"
                    )
            for stale in sorted(set(allowed) - fired):
                problems.append(f"{path.name}: the exception for {stale} is no longer needed")
    return problems


if __name__ == "__main__":
    found = lint()
    for problem in found:
        print(problem)
    print(f"squawk: {len(found)} problem(s) in the migrations" if found else "squawk: clean")
    sys.exit(1 if found else 0)
