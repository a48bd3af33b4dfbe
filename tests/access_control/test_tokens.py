"""Tokens are created with a secret shown once, stored as a digest, and revoked for good."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.access_control.tokens import TokenNotFound
from service.errors import InvalidInput
from tests.support.waiting import until_sync


async def test_the_secret_is_shown_once_and_only_its_digest_is_stored(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        new = await tokens.create_token(conn, "scheduler", description="scheduler-a")
    assert new.secret.startswith("llmgw_") and len(new.secret) > 40
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT * FROM api_tokens"))).mappings().one()
    assert new.secret not in {str(v) for v in stored.values()}
    assert stored["digest"] == tokens.digest(new.secret)
    assert (stored["role"], stored["description"]) == ("scheduler", "scheduler-a")


async def test_a_secret_authenticates_until_it_is_revoked(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        new = await tokens.create_token(conn, "agent", node_id="gpu-07")
    async with engine.connect() as conn:
        found = await tokens.authenticate(conn, new.secret)
        assert found is not None and (found.role, found.node_id) == ("agent", "gpu-07")
        assert await tokens.authenticate(conn, new.secret + "x") is None
    async with engine.begin() as conn:
        revoked = await tokens.revoke_token(conn, new.token.id)
    assert revoked.revoked
    async with engine.connect() as conn:
        assert await tokens.authenticate(conn, new.secret) is None


async def test_revoking_twice_keeps_the_first_time(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        new = await tokens.create_token(conn, "reader")
        first = await tokens.revoke_token(conn, new.token.id)
    async with engine.begin() as conn:
        again = await tokens.revoke_token(conn, new.token.id)
    assert again.revoked_at == first.revoked_at


async def test_revoking_an_unknown_token_names_it(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        with pytest.raises(TokenNotFound, match="tok_nope"):
            await tokens.revoke_token(conn, "tok_nope")


async def test_the_list_hides_revoked_tokens_unless_asked(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        kept = await tokens.create_token(conn, "reader", description="dashboard")
        gone = await tokens.create_token(conn, "operator", description="old laptop")
        await tokens.revoke_token(conn, gone.token.id)
    async with engine.connect() as conn:
        live = await tokens.list_tokens(conn)
        every = await tokens.list_tokens(conn, include_revoked=True)
    assert [t.id for t in live] == [kept.token.id]
    assert {t.id for t in every} == {kept.token.id, gone.token.id}


async def test_tokens_stay_in_force_after_the_last_one_is_revoked(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        assert not await tokens.any_tokens(conn)
        new = await tokens.create_token(conn, "reader")
        await tokens.revoke_token(conn, new.token.id)
        # Revoking every token must lock the API, not open it.
        assert await tokens.any_tokens(conn)


@pytest.mark.parametrize(
    ("role", "node_id", "field"),
    [
        ("admin", None, "role"),
        ("agent", None, "nodeId"),
        ("agent", "  ", "nodeId"),
        ("agent", "x" * 300, "nodeId"),
        ("reader", "gpu-07", "nodeId"),
        ("operator", "gpu-07", "nodeId"),
    ],
)
async def test_a_bad_request_names_the_field_and_stores_nothing(
    engine: AsyncEngine, role: str, node_id: str | None, field: str
) -> None:
    async with engine.begin() as conn:
        with pytest.raises(InvalidInput) as refused:
            await tokens.create_token(conn, role, node_id)
    assert refused.value.field == field
    async with engine.connect() as conn:
        assert await tokens.list_tokens(conn, include_revoked=True) == []


# --- the operator's CLI -------------------------------------------------------------------


def ctl(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    """`llmgw-inventory ctl --url URL ...` as an operator runs it: exit code, stdout, stderr."""
    from service.cli import build_parser
    from service.config import Settings

    args = build_parser().parse_args(["ctl", "--url", url, *argv])
    code: int = args.run(args, Settings())
    out, err = capsys.readouterr()
    return code, out, err


def test_ctl_creates_the_first_token_then_needs_one(
    live_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = live_service.url
    code, out, err = ctl(
        capsys, url, "tokens", "create", "--role", "operator", "--description", "me"
    )
    assert code == 0
    operator = out.splitlines()[-1]
    assert operator.startswith("llmgw_")
    # The first token locks out every tokenless caller: said on stderr, the secret still last.
    assert err == f"warning: {tokens.FIRST_TOKEN_WARNING}\n"

    # The service is closed now: the same command without a token is refused in one line.
    code, _, err = ctl(capsys, url, "tokens", "list")
    assert code == 1 and len(err.splitlines()) == 1 and "requires a token" in err

    code, out, err = ctl(
        capsys, url, "--token", operator, "tokens", "create", "--role", "agent", "--node", "gpu-07"
    )
    assert code == 0 and "for node gpu-07" in out
    assert err == ""
    agent = out.splitlines()[-1]
    heartbeat = httpx.post(
        url,
        json={"query": 'mutation { heartbeat(nodeId: "gpu-07") { id } }'},
        headers={"Authorization": f"Bearer {agent}"},
    ).json()
    assert heartbeat["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"  # authenticated

    code, out, _ = ctl(capsys, url, "--token", operator, "tokens", "list", "-o", "json")
    listed = json.loads(out)
    assert sorted((t["role"], t["nodeId"] or "") for t in listed) == [
        ("AGENT", "gpu-07"),
        ("OPERATOR", ""),
    ]

    agent_id = next(t["id"] for t in listed if t["role"] == "AGENT")
    code, out, _ = ctl(capsys, url, "--token", operator, "tokens", "revoke", agent_id)
    assert code == 0 and agent_id in out
    code, out, _ = ctl(capsys, url, "--token", operator, "tokens", "list", "--all")
    assert code == 0 and agent_id in out and "REVOKED" in out
    refused = httpx.post(url, json={"query": "{ nodes { id } }"}, headers={
        "Authorization": f"Bearer {agent}"})  # fmt: skip
    assert refused.status_code == 401


CREATE = """mutation { createToken(role: OPERATOR, description: "me") { secret warning } }"""


def test_the_first_token_warns_in_its_answer_and_later_ones_do_not(live_service: Any) -> None:
    first = httpx.post(live_service.url, json={"query": CREATE}).json()["data"]["createToken"]
    assert first["warning"] == tokens.FIRST_TOKEN_WARNING
    assert "every caller without one" in first["warning"] and "401" in first["warning"]
    second = httpx.post(
        live_service.url,
        json={"query": CREATE},
        headers={"Authorization": f"Bearer {first['secret']}"},
    ).json()["data"]["createToken"]
    assert second["warning"] is None


def test_with_a_bootstrap_token_the_first_stored_token_changes_nothing(
    live_service_factory: Any, engine: AsyncEngine
) -> None:
    service = live_service_factory({"INVENTORY_BOOTSTRAP_TOKEN": "boot-s3cret-0123456789"})
    made = httpx.post(
        service.url,
        json={"query": CREATE},
        headers={"Authorization": "Bearer boot-s3cret-0123456789"},
    ).json()["data"]["createToken"]
    assert made["secret"].startswith("llmgw_") and made["warning"] is None


def test_ctl_refuses_an_agent_token_without_a_node_naming_the_flag(
    live_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = ctl(capsys, live_service.url, "tokens", "create", "--role", "agent")
    assert code == 1
    assert err.startswith("llmgw-inventory ctl: --node is required"), err
    assert "nodeId" not in err


def test_ctl_makes_tokens_that_expire_and_lists_them_by_status(
    live_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime, timedelta

    url = live_service.url
    code, out, _ = ctl(capsys, url, "tokens", "create", "--role", "operator")
    operator = out.splitlines()[-1]
    as_operator = ("--token", operator)

    code, out, _ = ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader",
                       "--expires", "30d", "--description", "contractor")  # fmt: skip
    in_30_days = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%d")
    assert code == 0 and f"expires {in_30_days}" in out.splitlines()[0], out
    code, out, _ = ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader",
                       "--expires", "2999-01-31")  # fmt: skip
    assert code == 0 and "expires 2999-01-31 00:00 UTC" in out

    code, _, err = ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader",
                       "--expires", "2020-01-01")  # fmt: skip
    assert code == 1 and err.startswith(
        "llmgw-inventory ctl: --expires '2020-01-01T00:00:00+00:00'"
    )
    assert "already past" in err
    with pytest.raises(SystemExit):  # argparse: a usage error naming the flag
        ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader", "--expires", "soon")
    assert "--expires='soon'" in capsys.readouterr().err

    # One that expired, one revoked: the list tells them apart.
    code, out, _ = ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader",
                       "--expires", "1s", "--description", "brief")  # fmt: skip
    brief = re.findall(r"tok_[0-9a-f]+", out)[0]
    code, out, _ = ctl(capsys, url, *as_operator, "tokens", "create", "--role", "reader",
                       "--description", "leaked")  # fmt: skip
    leaked = re.findall(r"tok_[0-9a-f]+", out)[0]
    ctl(capsys, url, *as_operator, "tokens", "revoke", leaked)

    def listed_once_expired() -> str:
        code, out, _ = ctl(capsys, url, *as_operator, "tokens", "list", "--all")
        assert code == 0
        return out if re.search(rf"^{brief}\s+\S+\s+expired", out, re.MULTILINE) else ""

    out = until_sync(listed_once_expired, f"{brief} to be listed expired")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "ROLE", "STATUS", "NODE"]
    status = {row.split()[0]: row.split()[2] for row in rows}
    assert status[brief] == "expired" and status[leaked] == "revoked"
    assert sorted(status.values()).count("active") == 3
    code, out, _ = ctl(capsys, url, *as_operator, "tokens", "list", "-o", "json")
    listed = {t["id"]: t["status"] for t in json.loads(out)}
    assert listed[brief] == "EXPIRED" and leaked not in listed
