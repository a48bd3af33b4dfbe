"""GPU resets, seen through what a reset changes in NVML, and owed to the service until it has them.

A RESET_GPU remediation is carried out when the GPU is reset (nvidia-smi -r,
or the operator's automation through NVML or DCGM). NVML has no reset counter
and no event for it, but a reset leaves marks that nothing else does; the
agent compares each GPU (by UUID) with how it read in the previous scan:

- The volatile uncorrected ECC count went down. Volatile counts start again
  at zero when the GPU is reinitialized (a reset, a driver reload); they
  only grow otherwise, as long as the driver stays loaded, which it does on
  a node with persistence mode (nvidia-persistenced, standard on HGX and
  GB200) and while this agent's XID listener holds NVML open. An operator
  clearing the counts by hand (nvidia-smi -p 0) reads as a reset too.
- A pending row remap is no longer pending: remaps are applied (or fail)
  only at a reset (A100 and later).
- Pending page retirements are no longer pending (V100, T4): likewise
  applied only when the GPU is reinitialized.
- The driver's recovery action went from a reset (GPU_RESET, DRAIN_AND_RESET,
  BUS_RESET) to NONE: the driver no longer asks for the reset it asked for.

A reset that changes none of these (a GPU with no ECC errors, no pending
remap and no recovery action) is not seen: a reboot or clearGpuHealth still
carries its remediation out. A reading NVML could not give (None) compares
with nothing: a GPU that failed to answer once is not thereby reset.

What a scan finds waits here until a report carrying it reached the service
(GpuInput.resetSeen): taken for a report, given back if it was not stored,
as XIDs are (agent/discovery/xids.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llmgw.agent")

# The recovery actions that ask for a reset of the GPU (agent/discovery/gpus.py's names).
ASKS_FOR_RESET = frozenset({"GPU_RESET", "DRAIN_AND_RESET", "BUS_RESET"})
# What one GPU's evidence may grow to while resets pile up in an outage: the
# service refuses a resetSeen over 1,024 characters, and a report it refuses
# would carry the same evidence back for ever.
MAX_EVIDENCE = 500


def _joined(first: str, then: str) -> str:
    both = f"{first}; {then}"
    return both if len(both) <= MAX_EVIDENCE else both[: MAX_EVIDENCE - 3] + "..."


@dataclass(frozen=True)
class ResetMarks:
    """What a reset changes, as one scan read it; None where NVML could not say."""

    volatile_uncorrected_ecc: int | None = None
    remap_pending: bool | None = None
    retired_pages_pending: bool | None = None
    recovery_action: str | None = None


def evidence(before: ResetMarks, now: ResetMarks) -> str | None:
    """How `now` shows a reset since `before` (one GPU, one scan apart), or None."""
    seen = []
    if (
        before.volatile_uncorrected_ecc is not None
        and now.volatile_uncorrected_ecc is not None
        and now.volatile_uncorrected_ecc < before.volatile_uncorrected_ecc
    ):
        seen.append(
            f"volatile uncorrected ECC count went from {before.volatile_uncorrected_ecc} "
            f"to {now.volatile_uncorrected_ecc}"
        )
    if before.remap_pending and now.remap_pending is False:
        # Applied, or failed (the GPU then says row_remap_failed): at a reset either way.
        seen.append("the pending row remap was applied")
    if before.retired_pages_pending and now.retired_pages_pending is False:
        seen.append("the pending page retirement was applied")
    if before.recovery_action in ASKS_FOR_RESET and now.recovery_action == "NONE":
        seen.append(f"the driver's recovery action went from {before.recovery_action} to NONE")
    return "; ".join(seen) or None


class ResetWatch:
    """Each GPU's marks at the last scan, and the resets seen but not yet sent; any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, ResetMarks] = {}
        # GPU UUID -> how its reset was seen.
        self._pending: dict[str, str] = {}

    def observe(self, gpus: Iterable[tuple[str | None, ResetMarks]]) -> None:
        """One scan's GPUs (UUID, marks); a GPU without a UUID cannot be followed."""
        with self._lock:
            for uuid, marks in gpus:
                if uuid is None:
                    continue
                before = self._last.get(uuid)
                if before is not None:
                    seen = evidence(before, marks)
                    if seen is not None:
                        log.info("GPU %s was reset: %s", uuid, seen)
                        earlier = self._pending.get(uuid)
                        self._pending[uuid] = seen if earlier is None else _joined(earlier, seen)
                self._last[uuid] = _kept(before, marks)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def take(self) -> dict[str, str]:
        """Every reset waiting, now owed to the caller (give_back if it was not sent)."""
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def give_back(self, taken: Mapping[str, str]) -> None:
        """Resets whose report did not reach the service: sent with the next one."""
        with self._lock:
            for uuid, seen in taken.items():
                later = self._pending.get(uuid)
                self._pending[uuid] = seen if later is None else _joined(seen, later)


def _kept(before: ResetMarks | None, now: ResetMarks) -> ResetMarks:
    """The marks to compare the next scan with: a reading NVML could not give keeps the last one."""
    if before is None:
        return now
    return ResetMarks(
        *(b if n is None else n for b, n in zip(_values(before), _values(now), strict=True))
    )


def _values(marks: ResetMarks) -> tuple[Any, ...]:
    return (
        marks.volatile_uncorrected_ecc,
        marks.remap_pending,
        marks.retired_pages_pending,
        marks.recovery_action,
    )


def with_resets(node_input: dict[str, Any], resets: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a registerNode input whose GPUs carry the resets seen on them (by UUID).

    A reset of a GPU the report no longer lists cannot be sent: logged.
    """
    if not resets:
        return node_input
    gpus = []
    listed = set()
    for gpu in node_input.get("gpus", []):
        uuid = gpu.get("uuid")
        listed.add(uuid)
        seen = resets.get(uuid) if uuid is not None else None
        gpus.append({**gpu, "resetSeen": seen} if seen else gpu)
    for uuid in sorted(set(resets) - listed):
        log.error("GPU %s was reset (%s) but this report does not list it", uuid, resets[uuid])
    return {**node_input, "gpus": gpus}
