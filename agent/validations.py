"""Validation before re-admission: run the tests the inventory asks for, report what they said.

After a remediation (a reboot, a GPU reset) the inventory lists the tests its
policy requires before the GPUs take work again (validationsToRun, e.g.
`dcgm_diag`). The operator configures the command of each test:

    [validations.dcgm_diag]
    command = ["dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}"]
    timeout = 1800

`{gpus}` becomes the GPU indices, comma-separated. The agent asks what to run
after each full report, runs each test once at a time (never the same one
twice at once), with its timeout (a test that hangs is killed and counts as a
failure), and reports with recordValidation. A test passes when the command
exits 0 and, when it prints JSON (dcgmi's -j), no result in it says Fail: a
diagnostic that exits 0 with a failed test is a failure. A test the
inventory asks for that this node has no command for is logged once and left
for an operator's tool to report.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llmgw.agent")

# What the service keeps of a test's output (service/fleet/health/validations.py
# MAX_DETAILS): the end of it, where a failure says why.
MAX_DETAILS = 16_384
DEFAULT_TIMEOUT = 1800.0


@dataclass(frozen=True)
class ValidationCommand:
    argv: tuple[str, ...]
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class ValidationRequest:
    test: str
    gpu_indices: tuple[int, ...]
    remediation_id: str | None


@dataclass(frozen=True)
class ValidationOutcome:
    test: str
    gpu_indices: tuple[int, ...]
    passed: bool
    details: str

    def as_input(self, node_id: str) -> dict[str, Any]:
        return {
            "nodeId": node_id,
            "gpuIndices": list(self.gpu_indices),
            "test": self.test,
            "passed": self.passed,
            "details": self.details,
        }


def _says_fail(value: Any) -> bool:
    """Whether a JSON document holds a result or status of Fail (dcgmi diag -j's form)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.lower() in ("status", "result") and isinstance(item, str):
                if item.strip().lower() in ("fail", "failed", "failure"):
                    return True
            elif _says_fail(item):
                return True
    elif isinstance(value, list):
        return any(_says_fail(item) for item in value)
    return False


def _tail(text: str) -> str:
    return text if len(text) <= MAX_DETAILS else "..." + text[-(MAX_DETAILS - 3) :]


async def run_test(
    test: str, command: ValidationCommand, gpu_indices: Sequence[int]
) -> ValidationOutcome:
    """Run one test's command on these GPUs: passed, and the end of what it printed."""
    gpus = ",".join(str(i) for i in gpu_indices)
    argv = [arg.replace("{gpus}", gpus) for arg in command.argv]
    indices = tuple(gpu_indices)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as e:
        return ValidationOutcome(test, indices, False, f"could not run {argv[0]}: {e.strerror}")
    try:
        output, _ = await asyncio.wait_for(process.communicate(), command.timeout)
    except TimeoutError:
        return ValidationOutcome(
            test, indices, False, f"timed out after {command.timeout:g} s: {argv[0]} was killed"
        )
    finally:
        # Timed out, or the agent stopping (cancelled): the test does not outlive it.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    text = output.decode("utf-8", "replace")
    passed = process.returncode == 0
    if passed:
        with contextlib.suppress(ValueError):
            passed = not _says_fail(json.loads(text))
    details = text.strip() or f"{argv[0]} exited {process.returncode}"
    if not passed and process.returncode:
        details = f"exit status {process.returncode}\n{details}"
    return ValidationOutcome(test, indices, passed, _tail(details))


Ask = Callable[[], Awaitable[list[ValidationRequest]]]
Report = Callable[[ValidationOutcome], Awaitable[None]]


class Validations:
    """The tests this node can run, and the ones running now."""

    def __init__(self, commands: Mapping[str, ValidationCommand]) -> None:
        self.commands = dict(commands)
        self._running: dict[tuple[str, tuple[int, ...]], asyncio.Task[None]] = {}
        self._unknown_logged: set[str] = set()

    async def check(self, ask: Ask, report: Report) -> list[asyncio.Task[None]]:
        """Ask what to run; start each test not running yet. Returns the tasks started."""
        started = []
        for request in await ask():
            command = self.commands.get(request.test)
            if command is None:
                if request.test not in self._unknown_logged:
                    log.warning(
                        "the inventory asks for validation %r on GPU %s, which this node has no "
                        "command for (validations.%s in the agent's config)",
                        request.test,
                        ",".join(str(i) for i in request.gpu_indices),
                        request.test,
                    )
                    self._unknown_logged.add(request.test)
                continue
            key = (request.test, request.gpu_indices)
            if key in self._running and not self._running[key].done():
                continue
            task = asyncio.ensure_future(self._run(request, command, report))
            self._running[key] = task
            started.append(task)
        return started

    async def _run(
        self, request: ValidationRequest, command: ValidationCommand, report: Report
    ) -> None:
        log.info(
            "running validation %s on GPU %s", request.test, ",".join(map(str, request.gpu_indices))
        )
        outcome = await run_test(request.test, command, request.gpu_indices)
        log.log(
            logging.INFO if outcome.passed else logging.WARNING,
            "validation %s on GPU %s %s",
            outcome.test,
            ",".join(map(str, outcome.gpu_indices)),
            "passed" if outcome.passed else f"failed: {outcome.details.splitlines()[0][:200]}",
        )
        try:
            await report(outcome)
        except Exception as e:
            # Asked again after the next report: the test runs again then.
            log.warning("could not report validation %s: %s", outcome.test, e)

    async def stop(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
