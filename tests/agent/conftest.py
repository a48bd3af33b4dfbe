"""Fixtures of the agent's tests: process edges stood in for (a fake `dcgmi` on PATH)."""

import os
import shlex
import sys
from pathlib import Path

import pytest

from agent.validations import ValidationCommand
from tests.support.dcgmi import DCGMI_COMMAND, FAKE_DCGMI, Dcgmi


@pytest.fixture
def dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dcgmi:
    """Put a fake `dcgmi` that passes, fails or hangs first on PATH; the command that runs it."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")

    def install(outcome: str, timeout: float = 10, log: Path | None = None) -> ValidationCommand:
        script = bin_dir / "dcgmi"
        logged = f"FAKE_DCGMI_LOG={shlex.quote(str(log))} " if log is not None else ""
        script.write_text(
            "#!/bin/sh\n"
            f"{logged}FAKE_DCGMI={outcome} exec {shlex.quote(sys.executable)} "
            f'{shlex.quote(FAKE_DCGMI)} "$@"\n'
        )
        script.chmod(0o755)
        return ValidationCommand(DCGMI_COMMAND, timeout)

    return install
