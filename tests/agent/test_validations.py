"""Validation before re-admission on the node: the agent runs the tests asked for and reports them.

A fake `dcgmi` (tests/agent/fake_dcgmi.py) passes, fails (by its exit status,
or only in its JSON) or hangs; the agent's verdict and what it reports follow.
"""

import asyncio
import sys
from pathlib import Path

import pytest

from agent.config import ConfigError, load_config
from agent.validations import (
    MAX_DETAILS,
    ValidationCommand,
    ValidationOutcome,
    ValidationRequest,
    Validations,
    run_test,
)
from tests.support.dcgmi import Dcgmi

pytestmark = pytest.mark.process


async def test_a_passing_diagnostic_passes_with_its_output(tmp_path: Path, dcgmi: Dcgmi) -> None:
    log = tmp_path / "argv"
    outcome = await run_test("dcgm_diag", dcgmi("pass", log=log), [2, 3])
    assert outcome.passed
    assert outcome.gpu_indices == (2, 3)
    assert '"status": "Pass"' in outcome.details
    # {gpus} became the GPUs asked for.
    assert log.read_text().strip() == "diag -r 3 -j -i 2,3"


@pytest.mark.parametrize("how", ["fail", "fail-quietly"])
async def test_a_failing_diagnostic_fails_whatever_its_exit_status(how: str, dcgmi: Dcgmi) -> None:
    outcome = await run_test("dcgm_diag", dcgmi(how), [0])
    assert not outcome.passed
    assert '"status": "Fail"' in outcome.details
    if how == "fail":
        assert outcome.details.startswith("exit status 226")


async def test_a_hanging_diagnostic_is_killed_at_its_timeout(tmp_path: Path, dcgmi: Dcgmi) -> None:
    log = tmp_path / "argv"
    started = asyncio.get_running_loop().time()
    outcome = await run_test("dcgm_diag", dcgmi("hang", timeout=0.5, log=log), [1])
    assert asyncio.get_running_loop().time() - started < 5
    assert not outcome.passed
    assert outcome.details.startswith("timed out after 0.5 s: dcgmi was killed")


async def test_a_program_that_is_not_there_fails() -> None:
    outcome = await run_test("nccl", ValidationCommand(("/nonexistent/nccl-tests",)), [0])
    assert (outcome.passed, outcome.details) == (
        False,
        "could not run /nonexistent/nccl-tests: No such file or directory",
    )


async def test_long_output_keeps_its_end() -> None:
    command = ValidationCommand((sys.executable, "-c", "print('x' * 40000 + 'END')"))
    outcome = await run_test("noisy", command, [0])
    assert len(outcome.details) == MAX_DETAILS and outcome.details.endswith("END")


async def test_the_agent_runs_each_test_asked_once_and_reports_it(
    caplog: pytest.LogCaptureFixture, dcgmi: Dcgmi
) -> None:
    validations = Validations({"dcgm_diag": dcgmi("pass")})
    asked = [
        ValidationRequest("dcgm_diag", (2,), "7"),
        ValidationRequest("nccl_loopback", (2,), "7"),
    ]
    reported: list[ValidationOutcome] = []

    async def ask() -> list[ValidationRequest]:
        return asked

    async def report(outcome: ValidationOutcome) -> None:
        reported.append(outcome)

    first = await validations.check(ask, report)
    # Asked again while it runs: not started twice.
    assert await validations.check(ask, report) == []
    await asyncio.gather(*first)
    assert [(o.test, o.gpu_indices, o.passed) for o in reported] == [("dcgm_diag", (2,), True)]
    # The test the node has no command for is said once.
    messages = [r.getMessage() for r in caplog.records if "no command" in r.getMessage()]
    assert len(messages) == 1 and "nccl_loopback" in messages[0]


async def test_stopping_the_agent_kills_a_running_test(dcgmi: Dcgmi) -> None:
    validations = Validations({"dcgm_diag": dcgmi("hang", timeout=60)})

    async def ask() -> list[ValidationRequest]:
        return [ValidationRequest("dcgm_diag", (0,), "1")]

    async def report(outcome: ValidationOutcome) -> None:
        raise AssertionError("a stopped test reports nothing")

    [task] = await validations.check(ask, report)
    await asyncio.sleep(0.3)
    await asyncio.wait_for(validations.stop(), 10)
    assert task.cancelled()


def test_the_config_names_each_tests_command(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'node_id = "gpu-07"\n'
        "[validations.dcgm_diag]\n"
        'command = ["dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}"]\n'
        "timeout = 900\n"
        "[validations.nccl_loopback]\n"
        'command = ["/opt/nccl-tests/all_reduce_perf", "-g", "1"]\n'
    )
    config = load_config(str(path), {})
    assert config.validations == {
        "dcgm_diag": ValidationCommand(("dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}"), 900.0),
        "nccl_loopback": ValidationCommand(("/opt/nccl-tests/all_reduce_perf", "-g", "1")),
    }
    env = {"LLMGW_AGENT_NODE_ID": "n", "LLMGW_AGENT_VALIDATIONS": "dcgm_diag=dcgmi diag -r 1 -j"}
    assert load_config(None, env).validations == {
        "dcgm_diag": ValidationCommand(("dcgmi", "diag", "-r", "1", "-j"))
    }
    path.write_text('node_id = "n"\n[validations.dcgm_diag]\ncmd = ["dcgmi"]\n')
    with pytest.raises(ConfigError, match=r"validations\.dcgm_diag\.cmd = \['dcgmi'\]"):
        load_config(str(path), {})
    path.write_text('node_id = "n"\n[validations.dcgm_diag]\ncommand = ["dcgmi"]\ntimeout = -1\n')
    with pytest.raises(ConfigError, match=r"validations\.dcgm_diag\.timeout = -1"):
        load_config(str(path), {})
