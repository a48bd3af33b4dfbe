"""`ctl gpus cordon|uncordon|clear-health NODE INDEX`: the operator's verbs on one GPU.

Wired under `ctl gpus` by service/ctl/capacity.py, whose `ctl gpus` alone
prints the per-class summary.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client
from service.ctl.output import DASH

GPU_RESULT = "index healthy healthReasons stickyReasons cordonReason"


def gpu_text(gpu: dict[str, Any]) -> str:
    """'healthy', 'unhealthy (ecc_uncorrected)', plus its cordon and sticky reasons."""
    health = "healthy" if gpu["healthy"] else f"unhealthy ({', '.join(gpu['healthReasons'])})"
    sticky = gpu.get("stickyReasons") or []
    if sticky:
        health += f"; kept until a reset: {', '.join(sticky)}"
    if gpu.get("cordonReason"):
        health += f"; cordoned ({gpu['cordonReason']})"
    return health


def gpu_marks(gpu: dict[str, Any]) -> str:
    """What `ctl nodes` marks a GPU with: 'cordoned', its sticky reasons, or nothing."""
    marks = (["cordoned"] if gpu.get("cordonReason") else []) + list(gpu.get("stickyReasons") or [])
    return f"{gpu['index']}:{'+'.join(marks)}" if marks else ""


def marks_text(gpus: list[dict[str, Any]]) -> str:
    return " ".join(m for m in (gpu_marks(g) for g in gpus) if m) or DASH


def _verb(mutation: str, past: str, with_reason: bool) -> Any:
    def run(args: argparse.Namespace, client: Client) -> int:
        arguments: dict[str, tuple[str, Any]] = {
            "nodeId": ("ID!", args.node),
            "index": ("Int!", args.index),
        }
        if with_reason:
            arguments["reason"] = ("String!", args.reason)
        gpu = client.mutate(mutation, arguments, GPU_RESULT)
        print(f"GPU {gpu['index']} on node {args.node} {past}: now {gpu_text(gpu)}")
        return 0

    return run


def add_verbs(gpus: argparse.ArgumentParser) -> None:
    verbs = gpus.add_subparsers(dest="gpus_command", metavar="VERB")
    for name, mutation, past, help_text, with_reason in (
        ("cordon", "cordonGpu", "cordoned",
         "take one GPU out of placement; what runs on it keeps running", True),
        ("uncordon", "uncordonGpu", "uncordoned", "offer the GPU for placement again", False),
        ("clear-health", "clearGpuHealth", "cleared",
         "forget its sticky reasons (xid_*) after resetting the GPU by hand", False),
    ):  # fmt: skip
        verb = verbs.add_parser(name, help=help_text)
        verb.add_argument("node")
        verb.add_argument("index", type=int)
        if with_reason:
            verb.add_argument("--reason", required=True, help="why, for the next operator to read")
        verb.set_defaults(handler=_verb(mutation, past, with_reason))
