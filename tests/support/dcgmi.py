"""A fake `dcgmi` on PATH: the agent's validation command, run as an operator configures it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.validations import ValidationCommand

FAKE_DCGMI = str(Path(__file__).resolve().parents[1] / "agent" / "fake_dcgmi.py")
# The command an operator configures (docs/agent/configuration.md), run as is:
# the fake answers as `dcgmi` on PATH, so the agent's lookup and exec are real.
DCGMI_COMMAND = ("dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}")
Dcgmi = Callable[..., ValidationCommand]
