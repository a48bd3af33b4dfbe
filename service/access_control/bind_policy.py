"""May the service listen on this address? Not without tokens, unless loopback.

With no tokens, every caller is an operator (that is how the first token is
created). That is safe only when nobody else can connect: so a token-less
service listens on loopback only, and asked for any other address it refuses
to start, with one line saying why and what to do. `--insecure` (or
INVENTORY_INSECURE) overrides for a lab, with a warning at every start.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class BindDecision:
    start: bool
    message: str | None = None  # the refusal, or the warning when started insecure


def is_loopback(host: str) -> bool:
    """Only addresses that are certainly loopback; a name could resolve anywhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_decision(host: str, tokens_in_force: bool, insecure: bool) -> BindDecision:
    if tokens_in_force or is_loopback(host):
        return BindDecision(start=True)
    if insecure:
        return BindDecision(
            start=True,
            message=(
                f"INSECURE: serving on {host} without tokens; anyone who can reach this port "
                "can change the inventory (create a token: llmgw-inventory ctl tokens create)"
            ),
        )
    return BindDecision(
        start=False,
        message=(
            f"refusing to listen on {host} without tokens (anyone could change the inventory): "
            "create one with `llmgw-inventory ctl tokens create --role operator` against a "
            "loopback service, set INVENTORY_BOOTSTRAP_TOKEN, or pass --insecure"
        ),
    )
