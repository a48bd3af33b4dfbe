"""InventoryClient: the generated client, with what every scheduler would otherwise write by hand.

The methods (place, allocate, release_replica, free_gpus, nodes, fit,
explain_placement, place_group...) and their typed results are generated from
the schema (generated/client.py). This layer adds, for every call:

- the token (`Authorization: Bearer ...`), and the caller's OpenTelemetry
  trace context as `traceparent` when OpenTelemetry is installed (tracing.py);
- a deadline: `timeout=` (the client's default, or per call) bounds the call,
  its retries included. The writes that hold GPUs send what is left of it, less
  `deadline_margin` for the way there, as `X-Client-Timeout`, so the service
  never commits one after its caller stopped waiting: a place that timed out
  here has not placed, and will not (docs/scheduler/deadlines.md);
- retries of the calls a second run answers the same, with backoff, honouring
  Retry-After (retries.py), and never of any other;
- typed errors carrying the service's code and message (errors.py);
- the whole answer of a paged list when `first` is not given (free_gpus,
  nodes, allocations, shards_to_move): pages of `page_size`, each after the
  last one's cursor, until a short one. An unpaged answer is never taken for
  the whole cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from time import time
from typing import Any, TypeVar, cast

import httpx
from pydantic_core import to_jsonable_python

from . import errors
from .generated.allocations import AllocationsAllocations
from .generated.base_model import UNSET, UnsetType
from .generated.client import Client
from .generated.exceptions import GraphQLClientGraphQLMultiError
from .generated.fragments import NodeDetails, NodeFreeGpus
from .generated.input_types import NodeFilter, TolerationInput
from .generated.shards_to_move import ShardsToMoveShardsToMove
from .retries import HOLD_GPUS, IDEMPOTENT, Retry
from .tracing import trace_headers

log = logging.getLogger("llmgw_inventory_client")

Entry = TypeVar("Entry")

# X-Client-Timeout's range (service/web/http_guards.py refuses others): more
# than 0, at most an hour.
_LONGEST_DEADLINE = 3600.0


@dataclass
class Answer:
    """One HTTP answer, its body parsed once (the generated methods call get_data on it)."""

    status_code: int
    body: Any
    text: str
    retry_after: float | None

    def json(self, **kwargs: Any) -> Any:
        return self.body


class InventoryClient(Client):
    """A scheduler's client of the inventory service (async; use `async with`).

    `url` is the service's GraphQL endpoint (http://host:8080/graphql); `token`
    a scheduler token (docs/security/tokens.md), or None where none is required.
    `timeout`: seconds each call may take in all, retries included (per call:
    `await client.place(shape, timeout=2.5)`). `http_client`: an httpx.AsyncClient
    of your own (its transport, limits, TLS), left open on close.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retry: Retry | None = None,
        deadline_margin: float = 0.1,
        page_size: int = 1000,
        http_client: httpx.AsyncClient | None = None,
        ws_url: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout={timeout}: the seconds a call may take, more than 0")
        if not 0 <= deadline_margin < timeout:
            raise ValueError(f"deadline_margin={deadline_margin}: from 0 to less than timeout")
        if page_size < 1:
            raise ValueError(f"page_size={page_size}: at least 1 (the service's maximum: 1000)")
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()
        super().__init__(
            url=url,
            headers=auth,
            # The generated client types its HTTP client by a Protocol httpx's
            # signatures do not match exactly; this layer sends with self._http.
            http_client=cast(Any, self._http),
            ws_url=ws_url or _ws_url(url),
            # A websocket sends its token once, in connection_init (docs/security/tokens.md).
            ws_connection_init_payload=auth or None,
        )
        self.timeout = timeout
        self.retry = retry or Retry()
        self.deadline_margin = deadline_margin
        self.page_size = page_size
        # Tries made again, by what failed (a code, or the transport error's name).
        self.retried: Counter[str] = Counter()

    async def __aexit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    # -- every call ----------------------------------------------------------

    async def execute(
        self,
        query: str,
        operation_name: str | None = None,
        variables: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Answer:
        timeout = kwargs.pop("timeout", None)
        extra_headers = kwargs.pop("headers", None) or {}
        if kwargs:
            raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        budget = self.timeout if timeout is None else float(timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        name = operation_name or ""
        payload = to_jsonable_python(
            {
                "query": query,
                "operationName": operation_name,
                "variables": self._convert_dict_to_json_serializable(variables or {}),
            }
        )
        attempts = self.retry.attempts if name in IDEMPOTENT else 1
        tries = 0
        while True:
            left = deadline - loop.time()
            headers = {**(self.headers or {}), **trace_headers(), **extra_headers}
            if name in HOLD_GPUS:
                # What the service may still take: the caller's time left, less the way back.
                allowed = min(left - self.deadline_margin, _LONGEST_DEADLINE)
                if allowed <= 0:
                    raise _out_of_time(name, budget, tries)
                headers["X-Client-Timeout"] = f"{allowed:.3f}"
            elif left <= 0:
                raise _out_of_time(name, budget, tries)
            tries += 1
            failure = await self._send(payload, headers, left)
            if isinstance(failure, Answer):
                return failure
            reason = failure.code or (
                type(failure.__cause__).__name__
                if failure.__cause__ is not None
                else f"HTTP {failure.status}"
            )
            wait = self.retry.delay(tries - 1, failure.retry_after)
            if tries >= attempts or loop.time() + wait >= deadline:
                if name in IDEMPOTENT and tries > 1:
                    log.info("%s failed after %d tries: %s", name, tries, failure)
                raise failure
            self.retried[reason] += 1
            log.info(
                "%s: %s; trying again in %.2fs (try %d of %d)",
                name, failure, wait, tries + 1, attempts,
            )  # fmt: skip
            await asyncio.sleep(wait)

    async def _send(
        self, payload: Any, headers: dict[str, str], left: float
    ) -> Answer | errors.InventoryError:
        """One try: the answer, or the error a retry may cure (raised if none may)."""
        try:
            async with asyncio.timeout(left):
                response = await self._http.post(
                    self.url, json=payload, headers=headers, timeout=left
                )
        except (TimeoutError, httpx.TimeoutException) as error:
            # The try had all the call's time left: the call's timeout ran out.
            # A hold sent with X-Client-Timeout will not commit after it either.
            late = errors.DeadlineExceeded(
                f"{self.url} did not answer within the {left:.2f}s left of the call's timeout"
            )
            late.__cause__ = error
            return late
        except httpx.TransportError as error:
            failure = errors.Unavailable(f"cannot reach {self.url}: {error!r}")
            failure.__cause__ = error
            return failure
        answer = Answer(
            status_code=response.status_code,
            body=_body(response),
            text=response.text,
            retry_after=_retry_after(response.headers.get("retry-after")),
        )
        refusal = _refusal(answer, self.url)
        if refusal is not None and isinstance(refusal, errors.Unavailable):
            return refusal
        return answer

    def get_data(self, response: Any) -> dict[str, Any]:
        answer: Answer = response
        refusal = _refusal(answer, self.url)
        if refusal is not None:
            raise refusal
        data: dict[str, Any] = answer.body["data"]
        return data

    async def execute_ws(
        self,
        query: str,
        operation_name: str | None = None,
        variables: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            import websockets  # noqa: F401
        except ImportError:
            raise ImportError(
                "subscriptions need the websockets package: "
                "pip install 'llmgw-inventory-client[events]'"
            ) from None
        stream = super().execute_ws(query, operation_name, variables, **kwargs)
        try:
            async for data in stream:
                yield data
        except GraphQLClientGraphQLMultiError as error:
            raise errors.from_answer(
                [e.original or {"message": e.message} for e in error.errors],
                status=200,
                retry_after=None,
                data=error.data,
            ) from None

    # -- whole answers of paged lists ------------------------------------------

    async def _listed(
        self,
        page: Callable[[int | UnsetType | None, str | UnsetType | None], Awaitable[list[Entry]]],
        cursor: Callable[[Entry], str],
        first: int | UnsetType | None,
        after: str | UnsetType | None,
    ) -> list[Entry]:
        """With `first`, that one page. Without it, every entry from `after` on: pages of
        page_size, each after the previous one's last cursor, until a short page
        (docs/scheduler/paging.md)."""
        if not _absent(first):
            return await page(first, after)
        entries: list[Entry] = []
        position = None if isinstance(after, UnsetType) else after
        while True:
            batch = await page(self.page_size, position)
            entries.extend(batch)
            if len(batch) < self.page_size:
                return entries
            position = cursor(batch[-1])

    async def free_gpus(
        self,
        gpu_class: str | UnsetType | None = UNSET,
        fabric: str | UnsetType | None = UNSET,
        min_free: int | UnsetType | None = UNSET,
        first: int | UnsetType | None = UNSET,
        after: str | UnsetType | None = UNSET,
        max_age: int | UnsetType | None = UNSET,
        tolerations: list[TolerationInput] | UnsetType | None = UNSET,
        **kwargs: Any,
    ) -> list[NodeFreeGpus]:
        """Free, healthy GPUs per node with at least `min_free`, sorted by node id: every
        node (all pages) without `first`, one page with it."""
        compiled = _absent(max_age) and _absent(tolerations)

        def page(size: int | UnsetType | None, position: str | UnsetType | None) -> Any:
            if compiled:  # the service's compiled page answers this document
                return self.free_gpus_compiled(
                    gpu_class=gpu_class, fabric=fabric, min_free=min_free, first=size,
                    after=position, **kwargs,
                )  # fmt: skip
            return super(InventoryClient, self).free_gpus(
                gpu_class=gpu_class, fabric=fabric, min_free=min_free, first=size,
                after=position, max_age=max_age, tolerations=tolerations, **kwargs,
            )  # fmt: skip

        return await self._listed(page, lambda entry: entry.node.id, first, after)

    async def nodes(
        self,
        filter_: NodeFilter | UnsetType | None = UNSET,
        first: int | UnsetType | None = UNSET,
        after: str | UnsetType | None = UNSET,
        max_age: int | UnsetType | None = UNSET,
        **kwargs: Any,
    ) -> list[NodeDetails]:
        """Nodes matching `filter_`, sorted by id: all of them without `first`, one page with it."""

        def page(size: int | UnsetType | None, position: str | UnsetType | None) -> Any:
            if _absent(max_age):  # the service's compiled page answers this document
                return self.nodes_compiled(filter_=filter_, first=size, after=position, **kwargs)
            return super(InventoryClient, self).nodes(
                filter_=filter_, first=size, after=position, max_age=max_age, **kwargs
            )

        return await self._listed(page, lambda node: node.id, first, after)

    async def allocations(
        self,
        node_id: str | UnsetType | None = UNSET,
        replica_id: str | UnsetType | None = UNSET,
        first: int | UnsetType | None = UNSET,
        after: str | UnsetType | None = UNSET,
        held: bool | UnsetType | None = UNSET,
        **kwargs: Any,
    ) -> list[AllocationsAllocations]:
        """Allocations sorted by shard id: all of them without `first`, one page with it."""

        def page(size: int | UnsetType | None, position: str | UnsetType | None) -> Any:
            return super(InventoryClient, self).allocations(
                node_id=node_id, replica_id=replica_id, first=size, after=position,
                held=held, **kwargs,
            )  # fmt: skip

        return await self._listed(page, lambda allocation: allocation.shard_id, first, after)

    async def shards_to_move(
        self,
        node_id: str | UnsetType | None = UNSET,
        first: int | UnsetType | None = UNSET,
        after: str | UnsetType | None = UNSET,
        **kwargs: Any,
    ) -> list[ShardsToMoveShardsToMove]:
        """Shards a NO_EXECUTE taint tells to stop, sorted by shard id: all of them without
        `first`, one page with it."""

        def page(size: int | UnsetType | None, position: str | UnsetType | None) -> Any:
            return super(InventoryClient, self).shards_to_move(
                node_id=node_id, first=size, after=position, **kwargs
            )

        return await self._listed(page, lambda shard: shard.shard_id, first, after)


def _absent(value: object) -> bool:
    """Not given: UNSET (left out of the request) or None (sent as null: the default)."""
    return value is None or isinstance(value, UnsetType)


def _ws_url(url: str) -> str:
    """The subscription endpoint: the same URL over ws:// (wss:// for https://)."""
    if url.startswith("https://"):
        return "wss://" + url[len("https://") :]
    if url.startswith("http://"):
        return "ws://" + url[len("http://") :]
    return url


def _body(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: a number, or an HTTP date (RFC 9110); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time())
    except (TypeError, ValueError):
        return None


def _refusal(answer: Answer, url: str) -> errors.InventoryError | None:
    """The error an answer carries, or None when it carries data and no error."""
    body = answer.body
    if not isinstance(body, dict) or ("data" not in body and "errors" not in body):
        return errors.without_graphql(answer.status_code, url, answer.retry_after, answer.text)
    found = body.get("errors")
    data = body.get("data")
    if found:
        listed = found if isinstance(found, list) else [found]
        return errors.from_answer(
            listed,
            status=answer.status_code,
            retry_after=answer.retry_after,
            data=data if isinstance(data, dict) else None,
        )
    if not isinstance(data, dict) or not 200 <= answer.status_code < 300:
        return errors.without_graphql(answer.status_code, url, answer.retry_after, answer.text)
    return None


def _out_of_time(name: str, budget: float, tries: int) -> errors.DeadlineExceeded:
    sent = f"after {tries} tries" if tries else "before it could be sent"
    return errors.DeadlineExceeded(f"{name}: its timeout of {budget:g}s ran out {sent}")
