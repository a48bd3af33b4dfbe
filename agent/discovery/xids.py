"""XID errors: heard from the driver as they happen, and sent at once.

A GPU that fell off the bus or raised a double-bit ECC error can look healthy
to NVML a minute later: the XID is an event, not a state, and a report that
only polls health would never say it happened. So a thread waits on NVML's
event set for critical XIDs (nvmlEventSetCreate, nvmlDeviceRegisterEvents
with nvmlEventTypeXidCriticalError, nvmlEventSetWait_v2) and drops each into
an XidInbox; the agent's loop wakes and sends a full report carrying them
(GpuInput.xids), instead of waiting for the next report interval. The service
decides which XIDs are critical to the GPU and keeps those until a reset.

XIDs that were taken for a report the service did not get are put back, so a
service outage delays them but does not lose them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("llmgw.agent")

# How long one wait on the event set blocks: the thread notices a stop request
# within this time.
WAIT_MS = 5000
# Per GPU: an XID storm during an outage does not grow the next report without
# bound (the service refuses more than 64 per GPU anyway; the rest are counted).
MAX_PENDING = 64


class XidInbox:
    """XIDs heard but not yet sent, by GPU index; filled from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived: asyncio.Event | None = None
        self.dropped = 0

    def bind(self) -> asyncio.Event:
        """The event the running loop waits on; set whenever an XID arrives."""
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        if self.waiting():
            self._arrived.set()
        return self._arrived

    def put(self, index: int, xid: int) -> None:
        with self._lock:
            listed = self._pending.setdefault(index, [])
            if len(listed) >= MAX_PENDING:
                self.dropped += 1
                return
            listed.append(xid)
        loop, arrived = self._loop, self._arrived
        if loop is not None and arrived is not None:
            # RuntimeError: the loop closed (the agent is stopping).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(arrived.set)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def take(self) -> dict[int, list[int]]:
        """Every XID waiting, now owed to the caller (give_back if it was not sent)."""
        with self._lock:
            taken, self._pending = self._pending, {}
        if self._arrived is not None:
            self._arrived.clear()
        return taken

    def give_back(self, taken: Mapping[int, list[int]]) -> None:
        """XIDs whose report did not reach the service: sent with the next one, in order."""
        if not taken:
            return
        with self._lock:
            for index, xids in taken.items():
                self._pending[index] = [*xids, *self._pending.get(index, [])][:MAX_PENDING]
        if self._arrived is not None:
            self._arrived.set()


def with_xids(node_input: dict[str, Any], xids: Mapping[int, list[int]]) -> dict[str, Any]:
    """A copy of a registerNode input whose GPUs carry the XIDs heard for them.

    XIDs of a GPU the report no longer lists (it fell off the bus, and NVML
    no longer counts it) cannot be sent as GpuInput.xids: they are logged.
    """
    gpus = []
    listed = set()
    for gpu in node_input.get("gpus", []):
        listed.add(gpu["index"])
        heard = xids.get(gpu["index"])
        gpus.append({**gpu, "xids": list(heard)} if heard else gpu)
    for index in sorted(set(xids) - listed):
        log.error("XIDs %s on GPU %d, which this report does not list", xids[index], index)
    return {**node_input, "gpus": gpus}


class XidListener:
    """The thread that waits for critical XIDs and puts them in an inbox."""

    def __init__(
        self, nvml: Any, inbox: XidInbox, *, wait_ms: int = WAIT_MS, warn: Callable[[str], None]
    ) -> None:
        self._nvml = nvml
        self._inbox = inbox
        self._wait_ms = wait_ms
        self._warn = warn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening: tuple[int, ...] = ()
        self.ready = threading.Event()

    def start(self) -> None:
        # A daemon thread: a wait inside the driver must not hold up exit.
        self._thread = threading.Thread(target=self._run, name="llmgw-agent-xids", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _error(self, name: str) -> type[BaseException]:
        found = getattr(self._nvml, name, None)
        return found if isinstance(found, type) else _NeverRaised

    def _run(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as e:
            self._warn(f"XIDs are not heard: NVML did not start ({type(e).__name__}: {e})")
            self.ready.set()
            return
        try:
            self._listen(nvml)
        except Exception:
            # A bug or a driver failure here must not pass silently: the node
            # would stop reporting XIDs and nobody would know.
            log.exception("the XID listener stopped; XIDs are no longer heard")
        finally:
            self.ready.set()
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _listen(self, nvml: Any) -> None:
        event_set = nvml.nvmlEventSetCreate()
        try:
            listening = []
            for index in range(int(nvml.nvmlDeviceGetCount())):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError, event_set
                    )
                except Exception as e:
                    # NotSupported on some GPUs and under some virtualization:
                    # said once, and the other GPUs are still heard.
                    self._warn(f"GPU {index}: XIDs are not heard ({type(e).__name__}: {e})")
                    continue
                listening.append(index)
            self.listening = tuple(listening)
            self.ready.set()
            if not listening:
                return
            timeout = self._error("NVMLError_Timeout")
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
                except timeout:
                    continue
                if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                    continue
                index = int(nvml.nvmlDeviceGetIndex(data.device))
                xid = int(data.eventData)
                log.warning("GPU %d raised XID %d: reporting it now", index, xid)
                self._inbox.put(index, xid)
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlEventSetFree(event_set)


class _NeverRaised(Exception):
    pass
