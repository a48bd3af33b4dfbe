"""Logs a person can read: an expected outcome is one INFO line with its request id and code, no
traceback; only a bug logs a traceback, once, at ERROR; `serve` starts without warnings.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import strawberry
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.graphql.fast.direct import DirectOperation
from service.graphql.fast.documents import PreparedDocuments
from service.graphql.masking import MaskUnexpected
from service.graphql.schema import InventorySchema
from service.web.logs import RequestIdFilter
from tests.support import REPO
from tests.support.api import Api
from tests.support.live_service import free_port
from tests.support.reports import ALLOCATE, REGISTER, allocation, node_input, shard

pytestmark = pytest.mark.process


@pytest.fixture
def log_records(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record at DEBUG and up, with the request id the service's handler would add."""
    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(RequestIdFilter())
    return caplog


def lines_of(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if getattr(r, "request_id", None) == request_id and not r.name.startswith("httpx")
        and r.name != "service.access"
    ]  # fmt: skip


async def test_each_expected_outcome_is_one_info_line_with_its_request_id_and_code(
    client: httpx.AsyncClient, engine: AsyncEngine, log_records: pytest.LogCaptureFixture
) -> None:
    api = Api(client)
    await api(REGISTER, {"input": node_input("gpu-01")})
    held = await api(ALLOCATE, allocation("r-1", shard("s-1", "gpu-01", 0)))
    assert held["allocate"]["__typename"] == "Allocated"
    async with engine.begin() as conn:
        reader = await tokens.create_token(conn, "reader", None, description="logs")
        operator = await tokens.create_token(conn, "operator", None, description="logs")

    # (request id, headers, body or raw bytes, the code its line must carry; None: no line)
    cases: list[tuple[str, dict[str, str], Any, str | None]] = [
        ("bad-input", {}, {"query": '{ events(kinds: ["cordonned"]) { id } }'}, "BAD_INPUT"),
        ("bad-bytes", {}, {"query": "{ nodes(filter: {minLocalDiskFree: -1}) { id } }"},
         "BAD_INPUT"),
        ("forbidden", {"authorization": f"Bearer {reader.secret}"},
         {"query": 'mutation { cordonNode(id: "gpu-01", reason: "r") { id } }'}, "FORBIDDEN"),
        ("no-token", {}, {"query": "{ nodes { id } }"}, "UNAUTHENTICATED"),
        ("not-found", {"authorization": f"Bearer {operator.secret}"},
         {"query": 'mutation { cordonNode(id: "gpu-99", reason: "r") { id } }'},
         "NODE_NOT_FOUND"),
        ("rejected", {"authorization": f"Bearer {operator.secret}"},
         {"query": ALLOCATE, "variables": allocation("r-2", shard("s-2", "gpu-01", 0))}, None),
        ("malformed", {"authorization": f"Bearer {operator.secret}"}, b"[1, 2]", "BAD_REQUEST"),
    ]  # fmt: skip
    for request_id, headers, body, code in cases:
        headers = {**headers, "x-request-id": request_id}
        if isinstance(body, bytes):
            headers["content-type"] = "application/json"
            response = await client.post("/graphql", content=body, headers=headers)
        else:
            response = await client.post("/graphql", json=body, headers=headers)
        assert response.status_code < 500, response.text
        if request_id == "rejected":
            assert response.json()["data"]["allocate"]["__typename"] == "AllocationRejected"
        lines = lines_of(log_records, request_id)
        assert len(lines) == (0 if code is None else 1), (
            request_id,
            [r.getMessage() for r in lines],
        )
        for record in lines:
            assert record.levelno <= logging.INFO, (request_id, record.getMessage())
            assert record.exc_info is None, (request_id, record.getMessage())
            assert getattr(record, "code", None) == code, (request_id, record.getMessage())
            assert code in record.getMessage()


@strawberry.type
class Broken:
    @strawberry.field
    def bug(self) -> int:
        raise KeyError("secret-internal-detail")


class FakeContext:
    request_id = "req-bug"


def test_a_bug_logs_its_traceback_once_at_error_on_strawberrys_route(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = InventorySchema(query=Broken, extensions=[MaskUnexpected])
    with caplog.at_level(logging.DEBUG):
        result = broken.execute_sync("{ bug }", context_value=FakeContext())
    assert result.errors is not None
    assert result.errors[0].formatted["message"] == "internal error"
    with_traceback = [r for r in caplog.records if r.exc_info is not None]
    assert len(with_traceback) == 1, [r.getMessage() for r in caplog.records]
    assert with_traceback[0].levelno == logging.ERROR
    assert "req-bug" in with_traceback[0].getMessage()


async def test_a_bug_logs_its_traceback_once_at_error_on_the_direct_route(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = InventorySchema(query=Broken, extensions=[MaskUnexpected])
    prepared = await PreparedDocuments(broken._schema, (), 5000).get("{ bug }")
    assert prepared is not None
    operation = prepared.operation(None)
    assert operation is not None
    with caplog.at_level(logging.DEBUG):
        answered = await DirectOperation(broken, prepared, operation, None).run(
            None,
            FakeContext(),  # type: ignore[arg-type]
        )
    answer = answered.body
    assert b'"internal error"' in answer and b"secret-internal-detail" not in answer
    with_traceback = [r for r in caplog.records if r.exc_info is not None]
    assert len(with_traceback) == 1, [r.getMessage() for r in caplog.records]
    assert with_traceback[0].levelno == logging.ERROR
    assert "req-bug" in with_traceback[0].getMessage()


def test_a_plain_serve_start_shows_no_warning(tmp_path: Path) -> None:
    """No XDG_RUNTIME_DIR (any plain shell or container): nothing a user cannot act on."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-quiet-", dir="/tmp"))
    root.chmod(0o755)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "XDG_RUNTIME_DIR")}
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port),
         "--data-dir", str(root / "pgdata")],
        env=env,
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "serve exited during start-up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        subprocess.run(["rm", "-rf", str(root)], check=False)
    assert "XDG_RUNTIME_DIR" not in stderr, stderr
    assert "Warning" not in stderr and " WARNING " not in stderr, stderr
