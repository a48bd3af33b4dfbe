"""wrk as the floor section's load generator, when it is installed.

Why: the floor section (floor.py) asks how much of one process's ceiling the
service keeps, on a machine of two cores that the service, PostgreSQL and
the load generator share. benchmarks/client.py spends about 0.04 ms of CPU a
request, which it takes from the core PostgreSQL runs on; the floor, which
has no database, does not pay for that, the heartbeat does (its batch waits
on PostgreSQL while the client holds the core). wrk, written in C, spends a
fraction of that. The issue that set the floor's targets names both ("wrk or
your own, 32 connections"); docs/history/benchmarks-journal.md gives the figures of both.

One thread, `connections` keep-alive connections, each request the next of
`bodies` in turn. A Lua script counts every answer that is not a 200 or that
carries GraphQL errors, so a wrong answer is a failure here as it is in
client.py's rounds, never a fast request.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

WRK = shutil.which("wrk")

# What the script's done() prints; wrk's own summary is not read.
_SUMMARY = re.compile(r"^llmgw: requests (\d+) duration_us (\d+) bad (\d+) errors (\d+)$", re.M)


@dataclass(frozen=True)
class WrkRound:
    rate: float  # answered requests a second
    requests: int
    seconds: float  # how long wrk sent them
    failures: int  # not a 200, GraphQL errors, or a socket error


def _lua_string(value: str) -> str:
    """A Lua long string holding `value` as is."""
    level = 0
    while f"]{'=' * level}]" in value:
        level += 1
    return f"[{'=' * level}[{value}]{'=' * level}]"


def lua_script(path: str, bodies: list[bytes], headers: dict[str, str]) -> str:
    """The script that sends `bodies` in turn to `path` and counts wrong answers."""
    table = ",\n".join(_lua_string(body.decode()) for body in bodies)
    head = {"Content-Type": "application/json", **headers}
    header_table = ", ".join(f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in head.items())
    return f"""
local bodies = {{
{table}
}}
local headers = {{ {header_table} }}
local path = {_lua_string(path)}
local threads = {{}}
local next_body = 0
bad = 0

function setup(thread)
  table.insert(threads, thread)
end

function request()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", path, headers, bodies[next_body])
end

function response(status, headers, body)
  if status ~= 200 or string.find(body, '"errors"', 1, true) then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local wrong = 0
  for _, thread in ipairs(threads) do
    wrong = wrong + thread:get("bad")
  end
  local e = summary.errors
  io.write(string.format("llmgw: requests %d duration_us %d bad %d errors %d\\n",
    summary.requests, summary.duration, wrong, e.connect + e.read + e.write + e.timeout))
end
"""


def run(
    url: str, bodies: list[bytes], headers: dict[str, str], connections: int, seconds: float
) -> WrkRound:
    """One round of wrk against `url` (blocking: run it in a thread from async code)."""
    if WRK is None:
        raise RuntimeError("wrk is not installed")
    with tempfile.TemporaryDirectory(prefix="llmgw-wrk-") as folder:
        script = Path(folder) / "bodies.lua"
        script.write_text(lua_script(urlsplit(url).path or "/", bodies, headers))
        done = subprocess.run(
            [
                WRK,
                "-t1",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "10s",
                "-s",
                str(script),
                url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
    summary = _SUMMARY.search(done.stdout)
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    requests, duration_us, bad, errors = map(int, summary.groups())
    return WrkRound(
        rate=(requests - bad) / (duration_us / 1e6) if duration_us else 0.0,
        requests=requests,
        seconds=duration_us / 1e6,
        failures=bad + errors,
    )
