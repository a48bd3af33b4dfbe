"""Concurrent token lookups share one statement, and each still gets its own answer.

Agents beat every few seconds with their own node tokens; service/access_control/token_lookups.py
answers the lookups that arrive together with one SELECT. Revocation must
still take effect from the next request on, and a lookup must never get
another token's record.
"""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import token_lookups, tokens
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input
from tests.support.statements import StatementCounter

HEARTBEAT = "mutation($id: ID!) { heartbeat(nodeId: $id) { id } }"


async def new_token(engine: AsyncEngine, role: str, node_id: str | None = None) -> str:
    async with engine.begin() as conn:
        return (await tokens.create_token(conn, role, node_id)).secret


async def test_concurrent_lookups_share_a_statement_and_each_gets_its_own_token(
    engine: AsyncEngine, count_statements: StatementCounter
) -> None:
    agents = {f"gpu-{i:02d}": await new_token(engine, "agent", f"gpu-{i:02d}") for i in range(20)}
    operator = await new_token(engine, "operator")
    revoked = await new_token(engine, "reader")
    async with engine.begin() as conn:
        gone = next(t for t in await tokens.list_tokens(conn) if t.role == "reader")
        await tokens.revoke_token(conn, gone.id)

    # Every agent, the operator twice, a revoked token and an unknown one, all at once.
    secrets = [*agents.values(), operator, operator, revoked, "llmgw_not-a-token"]
    # A lone lookup first: the engine's batches may have just answered a
    # round of other tests' lookups with nothing arriving meanwhile, a convoy
    # whose next round service/batches.py splits in two; a lone batch is none.
    await token_lookups.find_token(engine, operator)
    before = count_statements.count
    found = await asyncio.gather(*(token_lookups.find_token(engine, s) for s in secrets))
    lookups = [s for s in count_statements.statements[before:] if "api_tokens" in s]

    assert [r.node_id for r in found[:20] if r is not None] == list(agents)
    assert [r.role for r in found[20:22] if r is not None] == ["operator", "operator"]
    revoked_record = found[22]
    assert revoked_record is not None and revoked_record.status == "revoked"
    assert found[23] is None
    # All 24 arrived before the batch left: one statement answered them.
    assert len(lookups) == 1


async def test_every_lookup_after_a_revocation_refuses_the_token(
    engine: AsyncEngine,
) -> None:
    secret = await new_token(engine, "reader")
    record = await token_lookups.find_token(engine, secret)
    assert record is not None and record.active
    async with engine.begin() as conn:
        await tokens.revoke_token(conn, record.id)
    # A lookup started after the revocation committed never sees the token alive.
    again = await asyncio.gather(*(token_lookups.find_token(engine, secret) for _ in range(5)))
    assert [r.status if r is not None else None for r in again] == ["revoked"] * 5


async def test_agents_beating_with_their_own_tokens_at_once_are_each_checked_for_their_node(
    client: httpx.AsyncClient, api: Api, engine: AsyncEngine
) -> None:
    ids = [f"gpu-{i:02d}" for i in range(8)]
    for node_id in ids:
        await api(REGISTER, {"input": node_input(node_id)})
    secrets = {node_id: await new_token(engine, "agent", node_id) for node_id in ids}

    async def beat(token_of: str, node_id: str) -> httpx.Response:
        return await client.post(
            "/graphql",
            json={"query": HEARTBEAT, "variables": {"id": node_id}},
            headers={"Authorization": f"Bearer {secrets[token_of]}"},
        )

    # Each agent beats its own node, and each also tries its neighbour's, all at once:
    # batched lookups must not hand one agent another's node binding.
    own = [beat(n, n) for n in ids]
    other = [beat(n, ids[(k + 1) % len(ids)]) for k, n in enumerate(ids)]
    replies = await asyncio.gather(*own, *other)
    for reply, node_id in zip(replies[: len(ids)], ids, strict=True):
        assert reply.json() == {"data": {"heartbeat": {"id": node_id}}}
    for reply in replies[len(ids) :]:
        body = reply.json()
        assert body["data"] is None
        assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN"
