"""DATABASE_URL as libpq writes it, one host or several, checked once and never printed with its password.

A PostgreSQL that fails over (Patroni, a managed service, a promoted standby)
is named by several hosts and `target_session_attrs=read-write`:

    postgresql://llmgw@pg-a:5432,pg-b:5432/llmgw?target_session_attrs=read-write

SQLAlchemy's URL parser rejects that form (`invalid literal for int()` on the
port list), which crashed the service at start-up; asyncpg's connect() reads
it, tries the hosts in order and keeps the first that is a primary. So the
service never hands this URL to SQLAlchemy: it checks it here, and every
connection (both pools, the LISTEN connection, migrations) is opened by
asyncpg from `Database.dsn`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]

SCHEMES = {
    "postgres",
    "postgresql",
    "postgresql+asyncpg",
    "postgresql+psycopg",
    "postgresql+psycopg2",
}
# libpq's values; asyncpg accepts the same.
SESSION_ATTRS = {"any", "primary", "standby", "prefer-standby", "read-write", "read-only"}


class DatabaseUrlError(ValueError):
    """DATABASE_URL cannot be used; the message shows it with the password hidden."""


@dataclass(frozen=True)
class Database:
    dsn: str  # postgresql://..., exactly as asyncpg.connect takes it (password included)
    hosts: tuple[str, ...]  # "pg-a:5432", or a Unix socket directory, in the order tried
    user: str | None
    database: str | None
    shown: str  # the URL with its password replaced by ***, for messages and logs

    @property
    def hosts_text(self) -> str:
        return ", ".join(self.hosts)

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    def one_host_dsns(self) -> tuple[str, ...]:
        """The URL once per host of its list, in order: each host gets a connect timeout of its own.

        asyncpg shares one timeout among all the hosts of a URL, so a first
        host that has vanished (a dead machine, a stopped container's address:
        no refusal, only silence) used it all up and the promoted standby
        behind it was never tried; libpq's connect_timeout is per host. With
        `prefer-standby` (which needs a look at every host first) or hosts
        given as `?host=`, the URL goes to asyncpg whole.
        """
        parts = urlsplit(self.dsn)
        userinfo, at, hostlist = parts.netloc.rpartition("@")
        attrs = dict(parse_qsl(parts.query)).get("target_session_attrs")
        if "," not in hostlist or attrs == "prefer-standby":
            return (self.dsn,)
        return tuple(
            urlunsplit((parts.scheme, f"{userinfo}{at}{host}", parts.path, parts.query, ""))
            for host in hostlist.split(",")
        )

    def redact(self, text: str) -> str:
        """`text` (an error from a driver, say) with this URL's password taken out."""
        password = _password(self.dsn)
        if not password:
            return text
        for form in {password, unquote(password)}:
            text = text.replace(form, "***")
        return text


def _password(url: str) -> str | None:
    userinfo = urlsplit(url).netloc.rpartition("@")[0]
    if ":" not in userinfo:
        return None
    return userinfo.split(":", 1)[1] or None


def _shown(url: str) -> str:
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    shown_query = "&".join(
        f"{k}=***" if k == "password" else f"{k}={v}" for k, v in parse_qsl(parts.query)
    )
    return urlunsplit((parts.scheme, f"{userinfo}{at}{hostlist}", parts.path, shown_query, ""))


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\[\]:/]*)(?::(.*))?$")


def parse(url: str, name: str = "DATABASE_URL") -> Database:
    """Check a database URL and say exactly what is wrong with it, never echoing the password.

    `name`: the variable it came from, which the messages name
    (INVENTORY_READ_DATABASE_URL for the read replicas).
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError as error:
        # urlsplit's own message never includes the URL.
        raise DatabaseUrlError(f"{name} cannot be parsed: {error}") from None
    shown = _shown(url.strip())
    if parts.scheme not in SCHEMES:
        raise DatabaseUrlError(
            f"{name}={shown!r}: expected a postgresql:// URL, got scheme {parts.scheme!r}"
        )
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    hosts: list[str] = []
    for item in hostlist.split(",") if hostlist else []:
        match = _HOST.match(item)
        if match is None or not match.group(1):
            raise DatabaseUrlError(f"{name}={shown!r}: host {item!r} is not host[:port]")
        host, port = match.group(1), match.group(2)
        if port is not None and (not port.isdigit() or not 0 < int(port) <= 65535):
            raise DatabaseUrlError(
                f"{name}={shown!r}: port {port!r} of host {host!r} is not a port number"
            )
        hosts.append(f"{host}:{port or 5432}")
    if not hosts:
        # libpq's `?host=/run/postgresql` (a socket directory), or its default.
        hosts = [h for h in query.get("host", "").split(",") if h] or ["localhost:5432"]
    attrs = query.get("target_session_attrs")
    if attrs is not None and attrs not in SESSION_ATTRS:
        raise DatabaseUrlError(
            f"{name}={shown!r}: target_session_attrs={attrs!r}, expected one of "
            + ", ".join(sorted(SESSION_ATTRS))
        )
    user = unquote(userinfo.split(":", 1)[0]) if userinfo else query.get("user")
    database = unquote(parts.path.lstrip("/")) or query.get("dbname") or None
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
    return Database(dsn=dsn, hosts=tuple(hosts), user=user, database=database, shown=shown)


async def connect(dsn: str, *, timeout: float = 60.0, **options: Any) -> Any:  # noqa: ASYNC109 (asyncpg pool passes timeout=)
    """asyncpg.connect to the first host of `dsn` that answers and fits target_session_attrs.

    Each host gets the whole `timeout` (see Database.one_host_dsns). The
    signature is asyncpg's, so its pool can open connections with it too.
    Raises the last host's error when none would do.
    """
    last: Exception | None = None
    for one in parse(dsn).one_host_dsns():
        try:
            return await asyncpg.connect(one, timeout=timeout, **options)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the next host, as libpq does; the last error is raised
            last = error
    assert last is not None
    raise last
