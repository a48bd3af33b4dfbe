"""`ctl tenants` and `ctl budgets`: who holds how much of each GPU class against its quota, and the disruption budgets.

A usage bar per tenant and class, as wide as the limit (or, without one,
what the tenant holds plus what it could get now):

    [########++++....]  20/24, 16 guaranteed

`#` held within the guarantee, `+` borrowed (held beyond it), `.` room left
under the limit, `!` held above the limit (a limit lowered below use).
"""

from __future__ import annotations

import argparse
from typing import Any

from service.ctl.client import Client, CtlError
from service.ctl.output import DASH, add_output_option, print_json, table

# Where `ctl --help` lists these (after groups).
HELP_ORDER = 27

BAR_WIDTH = 24

TENANT_FIELDS = """
id description
quotas { gpuClass guaranteed limit }
usage { gpuClass used borrowed guaranteed limit available }
notices
"""
TENANTS = f"query Tenants {{ tenants {{ {TENANT_FIELDS} }} }}"
TENANT = f"query Tenant($id: ID!) {{ tenant(id: $id) {{ {TENANT_FIELDS} }} }}"
BUDGETS = """
query Budgets($tenant: ID) {
  disruptionBudgets(tenant: $tenant) { tenant deployment minAvailable placed }
}
"""


def usage_bar(used: int, guaranteed: int, limit: int | None, available: int) -> str:
    """The tenant's use of one class as a bar (see the module's docstring) and its numbers."""
    span = max(limit if limit is not None else used + available, used, 1)
    scale = BAR_WIDTH / span

    def cells(n: int) -> int:
        return round(n * scale)

    within = min(used, guaranteed)
    if limit is not None and used > limit:
        bar = "#" * cells(min(within, limit)) + "+" * cells(max(0, limit - within))
        bar += "!" * max(0, BAR_WIDTH - len(bar))
    else:
        bar = "#" * cells(within) + "+" * cells(used - within)
        bar += "." * max(0, BAR_WIDTH - len(bar))
    of = f"{used}/{limit}" if limit is not None else f"{used} (no limit)"
    return f"[{bar[:BAR_WIDTH]}] {of}, {guaranteed} guaranteed"


def tenants_table(found: list[dict[str, Any]]) -> str:
    rows = []
    for t in found:
        if not t["usage"]:
            rows.append([t["id"], DASH, "0", DASH, DASH, DASH, "holds nothing"])
        for u in t["usage"]:
            limit = u["limit"]
            rows.append(
                [
                    t["id"],
                    u["gpuClass"],
                    str(u["used"]),
                    str(u["borrowed"]),
                    DASH if limit is None else str(limit),
                    str(u["available"]),
                    usage_bar(u["used"], u["guaranteed"], limit, u["available"]),
                ]
            )
    return table(["TENANT", "CLASS", "USED", "BORROWED", "LIMIT", "AVAILABLE", "USE"], rows)


def show_tenants(args: argparse.Namespace, client: Client) -> int:
    if args.tenant is not None:
        one = client.execute(TENANT, {"id": args.tenant})["tenant"]
        if one is None:
            raise CtlError(f"no tenant {args.tenant!r}", "id")
        found = [one]
    else:
        found = client.execute(TENANTS)["tenants"]
    if args.output == "json":
        print_json(found if args.tenant is None else found[0])
        return 0
    print(tenants_table(found))
    notices = [(t["id"], n) for t in found for n in t["notices"]]
    for tenant, notice in notices:
        print(f"note: tenant {tenant}: {notice}")
    return 0


def budgets_table(found: list[dict[str, Any]]) -> str:
    rows = [
        [
            b["tenant"],
            b["deployment"],
            str(b["minAvailable"]),
            str(b["placed"]),
            "ok" if b["placed"] >= b["minAvailable"] else "below its minimum",
        ]
        for b in found
    ]
    return table(["TENANT", "DEPLOYMENT", "MIN AVAILABLE", "PLACED", "STATUS"], rows)


def show_budgets(args: argparse.Namespace, client: Client) -> int:
    found = client.execute(BUDGETS, {"tenant": args.tenant})["disruptionBudgets"]
    if args.output == "json":
        print_json(found)
        return 0
    if not found:
        print("no disruption budgets")
        return 0
    print(budgets_table(found))
    return 0


def register(commands: Any) -> None:
    tenants = commands.add_parser(
        "tenants", help="tenants: what each holds of every GPU class against its quota"
    )
    tenants.add_argument("tenant", nargs="?", help="one tenant's id")
    add_output_option(tenants)
    tenants.set_defaults(handler=show_tenants)

    budgets = commands.add_parser(
        "budgets", help="disruption budgets: each deployment's minimum and what it has placed"
    )
    budgets.add_argument("--tenant", help="one tenant's budgets")
    add_output_option(budgets)
    budgets.set_defaults(handler=show_budgets)
