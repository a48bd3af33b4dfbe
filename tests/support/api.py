"""The GraphQL API as a scheduler, agent or operator script uses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


class GraphQLFailure(AssertionError):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0].get("message") if errors else "no errors")
        self.errors = errors

    @property
    def first(self) -> dict[str, Any]:
        return self.errors[0]


@dataclass
class Api:
    """A GraphQL client the way a scheduler, agent or operator script would use it."""

    client: httpx.AsyncClient
    headers: dict[str, str] | None = None

    async def raw(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.client.post(
            "/graphql", json={"query": query, "variables": variables or {}}, headers=self.headers
        )
        assert response.status_code < 500, response.text
        body: dict[str, Any] = response.json()
        return body

    async def __call__(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = await self.raw(query, variables)
        if body.get("errors"):
            raise GraphQLFailure(body["errors"])
        return body["data"]

    async def fails(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The first error of a request that must fail; the test fails if it succeeds."""
        body = await self.raw(query, variables)
        assert body.get("errors"), f"expected an error, got {body}"
        first: dict[str, Any] = body["errors"][0]
        return first
