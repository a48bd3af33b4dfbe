"""The ctl's GraphQL client: one request at a time, every failure turned into one line.

An operator running `ctl nodes` at 3 a.m. needs "cannot reach the service at
URL" or "the token was refused", not a traceback: every failure a handler can
meet is a CtlError whose message is that line.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

DEFAULT_URL = "http://127.0.0.1:8080/graphql"


class CtlError(Exception):
    """An expected failure; str(error) is the one line the operator reads.

    `field` is the GraphQL argument a BAD_INPUT error named, so a command can
    name the flag the operator typed instead (see `flag_error`).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def flag_error(error: CtlError, flags: dict[str, str]) -> CtlError:
    """The same error, naming the command's flag instead of the API's field.

    The service says `nodeId=None: an agent token is bound to one node...`;
    the operator typed (or forgot) `--node`.
    """
    flag = flags.get(error.field or "")
    message = str(error)
    if flag is None or error.field is None or not message.startswith(f"{error.field}="):
        return error
    shown, _, problem = message[len(error.field) + 1 :].partition(": ")
    if shown == "None":
        return CtlError(f"{flag} is required: {problem}", flag)
    return CtlError(f"{flag} {shown}: {problem}", flag)


# Entries asked per page when ctl reads a whole list (Client.every): the
# service's own cap on a page is larger (INVENTORY_MAX_PAGE_SIZE, 1000 by default).
PAGE = 500


class Client:
    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def execute(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response's data; raises CtlError on any transport, HTTP or GraphQL error."""
        try:
            response = self._http.post(
                self.url, json={"query": query, "variables": variables or {}}
            )
        except httpx.TimeoutException:
            raise CtlError(f"the service at {self.url} did not answer in time") from None
        except httpx.HTTPError as error:
            raise CtlError(f"cannot reach the service at {self.url}: {_reason(error)}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        errors = body.get("errors") if isinstance(body, dict) else None
        if response.status_code in (401, 403):
            if response.status_code == 401 and not self.token:
                raise CtlError(NO_TOKEN_SENT)
            said = _error_line(errors[0]) if errors else f"HTTP {response.status_code}"
            hint = "" if "INVENTORY_TOKEN" in said else " (pass --token or set INVENTORY_TOKEN)"
            raise CtlError(f"the service refused the request: {said}{hint}")
        if not isinstance(body, dict):
            raise CtlError(
                f"the service at {self.url} answered HTTP {response.status_code} without GraphQL"
                f"{endpoint_hint(self.url)}"
            )
        if errors:
            field = (errors[0].get("extensions") or {}).get("field")
            raise CtlError(_error_line(errors[0]), field if isinstance(field, str) else None)
        if response.status_code >= 400 or not isinstance(body.get("data"), dict):
            raise CtlError(f"the service at {self.url} answered HTTP {response.status_code}")
        data: dict[str, Any] = body["data"]
        return data

    def every(
        self, query: str, field: str, cursor: str, variables: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Every entry of a paged list, page by page: the service caps a page (PAGE asked
        each time), and the query takes $first and $after; `cursor` is the entry's key
        that the next page starts after."""
        found: list[dict[str, Any]] = []
        after: Any = None
        while True:
            page = self.execute(query, {**(variables or {}), "first": PAGE, "after": after})[field]
            found.extend(page)
            if len(page) < PAGE:
                return found
            after = page[-1][cursor]

    def mutate(
        self, field: str, arguments: dict[str, tuple[str, Any]], selection: str
    ) -> dict[str, Any]:
        """Call one mutation with its arguments as variables: name -> (GraphQL type, value)."""
        signature = ", ".join(f"${name}: {kind}" for name, (kind, _) in arguments.items())
        call = ", ".join(f"{name}: ${name}" for name in arguments)
        query = f"mutation Verb({signature}) {{ {field}({call}) {{ {selection} }} }}"
        variables = {name: value for name, (_, value) in arguments.items()}
        result: dict[str, Any] = self.execute(query, variables)[field]
        return result


# The service's own 401 speaks to every caller (curl, GraphiQL's Headers pane); the
# ctl knows it sent nothing, and says what to pass, and where a token comes from.
NO_TOKEN_SENT = (
    "the service requires a token and none was sent: pass --token TOKEN or set "
    "INVENTORY_TOKEN (an operator makes one with `llmgw-inventory ctl tokens create "
    "--role operator`; in a checkout `python3 dev.py ctl tokens create --role operator`)"
)


def endpoint_hint(url: str) -> str:
    """A hint when the URL names the service but not its GraphQL endpoint (`/graphql`)."""
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/graphql"):
        return ""
    return f" (the GraphQL endpoint is /graphql: --url {url.rstrip('/')}/graphql)"


def _reason(error: httpx.HTTPError) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0]


def _error_line(error: dict[str, Any]) -> str:
    message = str(error.get("message") or "the service reported an error")
    code = (error.get("extensions") or {}).get("code")
    if code in ("UNAUTHENTICATED", "FORBIDDEN"):
        return f"{message} (pass --token or set INVENTORY_TOKEN)"
    return message.splitlines()[0]
