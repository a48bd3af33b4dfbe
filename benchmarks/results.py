"""Rows of the results table, printed for a person and written as Markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.measure import Figure


@dataclass
class Row:
    size: int
    name: str
    unit: str
    value: Figure
    baseline_name: str = ""
    baseline: Figure | None = None
    statements: str = ""
    note: str = ""
    # "higher" when more is better (rates), "lower" for latencies.
    better: str = "higher"

    @property
    def ratio(self) -> float:
        if self.baseline is None or not self.baseline.values or self.baseline.median == 0:
            return math.nan
        return self.value.median / self.baseline.median


def fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def spread(figure: Figure | None) -> str:
    if figure is None or not figure.values:
        return "-"
    return f"{fmt(figure.median)} ({fmt(figure.low)}-{fmt(figure.high)})"


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(f"  {self.line(row)}", flush=True)
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    @staticmethod
    def line(row: Row) -> str:
        ratio = "" if math.isnan(row.ratio) else f"  x{row.ratio:.2f} vs {row.baseline_name}"
        base = f" [baseline {spread(row.baseline)}]" if row.baseline else ""
        return f"{row.size:>7} {row.name}: {spread(row.value)} {row.unit}{base}{ratio} {row.note}"

    def markdown(self) -> str:
        out = [
            "| nodes | figure | service: median (min-max) | baseline | baseline: median (min-max) "
            "| ratio | SQL stmts/request | note |",
            "| ---: | --- | --- | --- | --- | ---: | ---: | --- |",
        ]
        for r in self.rows:
            ratio = "-" if math.isnan(r.ratio) else f"{r.ratio:.2f}x"
            out.append(
                f"| {r.size:,} | {r.name} | {spread(r.value)} {r.unit} | {r.baseline_name or '-'} "
                f"| {spread(r.baseline)} | {ratio} | {r.statements or '-'} | {r.note} |"
            )
        out.extend(["", "Targets:", ""])
        out.extend(f"- {line}" for line in targets(self.rows))
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"


def _find(rows: list[Row], size: int, prefix: str) -> Row | None:
    return next((r for r in rows if r.size == size and r.name.startswith(prefix)), None)


MET, NOT_MET, NOT_MEASURED = "met", "NOT met", "not measured"
# The start of each fast-path route's row (benchmarks/routes.py).
ROUTE_ROW = "fast path's "


@dataclass(frozen=True)
class Verdict:
    """One target, judged on this run's figures (or not measured in it, and why)."""

    target: str
    status: str
    figures: str

    def line(self) -> str:
        return f"{self.target}: {self.status} ({self.figures})"


def _judged(ok: bool) -> str:
    return MET if ok else NOT_MET


# Targets judged per cluster size: (name, the row it reads, the test, how the figure reads).
PER_SIZE = (
    ("registration >= 0.5x raw asyncpg", "registerNode, changed", "registration"),
    ("heartbeats >= 5,000/s", "heartbeat, 64 agents", "heartbeats"),
    ("heartbeats >= 5,000/s, agents' own tokens", "heartbeat with", "heartbeats"),
    ("place >= 1,500 claims/s", "place 1x H100-80GB, ", "allocation"),
    ("freeGpus after unchanged churn <= 1.2x before", "freeGpus p50 after", "churn"),
    ("full page req/s >= PostGraphile 5", "nodes(first 1000) full page req/s", "peer"),
    ("heartbeat >= 0.6x the bare Starlette floor, 1 process", "heartbeat (compiled)", "floor"),
    ("node(id) >= 0.3x the bare Starlette floor, 1 process", "node(id) { id state", "floor"),
)


def _per_size(name: str, row: Row) -> Verdict:
    if name.startswith("registration"):
        return Verdict(name, _judged(row.ratio >= 0.5), f"x{row.ratio:.2f}")
    if name.startswith("heartbeats"):
        return Verdict(name, _judged(row.value.median >= 5000), f"{fmt(row.value.median)}/s")
    if name.startswith("place"):
        return Verdict(name, _judged(row.value.median >= 1500), f"{fmt(row.value.median)}/s")
    if name.startswith("freeGpus after"):
        return Verdict(name, _judged(row.ratio <= 1.2), f"x{row.ratio:.2f}")
    if name.startswith("full page"):
        return Verdict(name, _judged(row.ratio >= 1), f"x{row.ratio:.2f}")
    goal = 0.6 if name.startswith("heartbeat") else 0.3
    return Verdict(name, _judged(row.ratio >= goal), f"x{row.ratio:.3f} of the floor's rate")


def verdicts(rows: list[Row]) -> list[Verdict]:
    """Every target, each with the figures it was judged on, or "not measured" and why."""
    out: list[Verdict] = []
    sizes = sorted({r.size for r in rows})
    free = "freeGpus(H100-80GB, minFree 4, first 50) p50"

    name = "freeGpus p50 at 10k nodes <= 0.5x the naive aggregate"
    at10k = _find(rows, 10_000, f"{free} vs the naive aggregate")
    if at10k is not None and at10k.baseline is not None:
        ok = at10k.value.median <= 0.5 * at10k.baseline.median
        figures = (
            f"{fmt(at10k.value.median)} ms vs {fmt(at10k.baseline.median)} ms, x{at10k.ratio:.2f}"
        )
        out.append(Verdict(name, _judged(ok), figures))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))
    name = "freeGpus p50 at 100k nodes <= 2x at 1k"
    small, large = _find(rows, 1_000, free), _find(rows, 100_000, free)
    if small is not None and large is not None:
        ok = large.value.median <= 2 * small.value.median
        figures = f"{fmt(large.value.median)} ms vs {fmt(small.value.median)} ms"
        out.append(Verdict(name, _judged(ok), figures))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes 1000,100000"))
    name = "place with nvlinkShards >= 0.8x place without, 10k nodes (issue 20)"
    nvlink = _find(rows, 10_000, "place 1x H100-80GB with nvlinkShards")
    if nvlink is not None:
        out.append(Verdict(name, _judged(nvlink.ratio >= 0.8), f"x{nvlink.ratio:.2f}"))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 31: what-if capacity by place's own planner, at most 2x one place.
    name = "fit for a TP-8 shape <= 2x one place of it, 10k nodes (issue 31)"
    fitted = _find(rows, 10_000, "fit TP-8 (1 shard of 8 H100-80GB) p50")
    if fitted is not None:
        out.append(Verdict(name, _judged(fitted.ratio <= 2.0), f"x{fitted.ratio:.2f}"))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 39: fit with nvlinkShards walks pools.
    name = "fit TP-8 with nvlinkShards <= 2x one place of it, 100k nodes (issue 39)"
    nvlink_fit = _find(rows, 100_000, "fit TP-8 (1 shard of 8 H100-80GB) with nvlinkShards p50")
    if nvlink_fit is not None:
        out.append(Verdict(name, _judged(nvlink_fit.ratio <= 2.0), f"x{nvlink_fit.ratio:.2f}"))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 100000"))

    # Issue 39: a disaggregated group placed as one unit, and counted.
    for name, row_name, bound in (
        ("placeGroup 2P(TP-4)+4D(TP-2) <= 3x one place of a TP-8, 10k nodes (issue 39)",
         "placeGroup 2P(TP-4)+4D(TP-2) p50, 1 caller in-process", 3.0),
        ("fitGroup of it <= 2x one placeGroup, 10k nodes (issue 39)",
         "fitGroup 2P(TP-4)+4D(TP-2) p50, 1 caller in-process", 2.0),
    ):  # fmt: skip
        row = _find(rows, 10_000, row_name)
        if row is not None:
            out.append(Verdict(name, _judged(row.ratio <= bound), f"x{row.ratio:.2f}"))
        else:
            out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 38: 1% of the GPUs tainted costs place and freeGpus at most 10%.
    for name, row_name in (
        ("place with 1% of GPUs tainted <= 1.1x untainted, 10k nodes (issue 38)",
         "place 1x H100-80GB with 1% of GPUs tainted p50, 1 caller in-process"),
        ("freeGpus with 1% of GPUs tainted <= 1.1x untainted, 10k nodes (issue 38)",
         "freeGpus(H100-80GB, minFree 4, first 50) with 1% of GPUs tainted p50, "
         "1 caller in-process"),
    ):  # fmt: skip
        row = _find(rows, 10_000, row_name)
        if row is not None:
            out.append(Verdict(name, _judged(row.ratio <= 1.1), f"x{row.ratio:.2f}"))
        else:
            out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 46: the tenant's limit checked in the claiming statement costs at most 10%.
    name = "place with a tenant's quota in force <= 1.1x place without, 10k nodes (issue 46)"
    quota = _find(rows, 10_000, "place 1x H100-80GB charged to a tenant with a quota p50")
    if quota is not None:
        out.append(Verdict(name, _judged(quota.ratio <= 1.1), f"x{quota.ratio:.2f}"))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 46: a place that must preempt (half the fleet held by lower priority)
    # costs at most 3x a place on free GPUs.
    name = "place that must preempt <= 3x place on free GPUs, 10k nodes (issue 46)"
    preempting = _find(rows, 10_000, "place 8x H100-80GB that must preempt")
    if preempting is not None:
        out.append(Verdict(name, _judged(preempting.ratio <= 3.0), f"x{preempting.ratio:.2f}"))
    else:
        out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))
    # Issue 47: reservations cost place at most 10%; fit(at:) at most 2x fit.
    for name, row_name, bound in (
        ("place with 1,000 reservations <= 1.1x place with none, 10k nodes (issue 47)",
         "place 1x H100-80GB with 1,000 reservations set aside p50", 1.1),
        ("fit(at:) <= 2x fit, 10k nodes, 1,000 reservations (issue 47)",
         "fit(at:) TP-8 inside 1,000 reservations' windows p50", 2.0),
    ):  # fmt: skip
        found = _find(rows, 10_000, row_name)
        if found is not None:
            out.append(Verdict(name, _judged(found.ratio <= bound), f"x{found.ratio:.2f}"))
        else:
            out.append(Verdict(name, NOT_MEASURED, "needs --sizes with 10000"))

    # Issue 45: each fast-path route pays for itself (benchmarks/routes.py): its CPU
    # per request at most 0.9x Strawberry's view's for the same request.
    routes = [r for r in rows if r.name.startswith(ROUTE_ROW)]
    for row in routes:
        out.append(
            Verdict(
                f"{row.size:,} nodes: {row.name}: CPU per request <= 0.9x Strawberry's view's",
                _judged(row.ratio <= 0.9),
                f"x{row.ratio:.2f}",
            )
        )
    if not routes:
        out.append(
            Verdict("each fast-path route's CPU per request <= 0.9x Strawberry's view's",
                    NOT_MEASURED, "the routes section did not run")
        )  # fmt: skip

    for name, prefix, section in PER_SIZE:
        judged = False
        for size in sizes:
            row = _find(rows, size, prefix) or next(
                (r for r in rows if r.size == size and prefix in r.name), None
            )
            if row is not None:
                verdict = _per_size(name, row)
                out.append(Verdict(f"{size:,} nodes: {name}", verdict.status, verdict.figures))
                judged = True
        if not judged:
            out.append(Verdict(name, NOT_MEASURED, f"the {section} section did not run"))

    # Issue 30: loaded through the API, asked before and after ANALYZE, per
    # layout: the whole answer at most 1x the naive SQL, first 50 at most 0.5x.
    real = [r for r in rows if r.name.startswith("real cluster, ")]
    for row in real:
        bound = 1.0 if "whole answer" in row.name else 0.5
        out.append(
            Verdict(
                f"{row.size:,} nodes: {row.name.removesuffix(' p50')} <= {bound}x the naive SQL",
                _judged(row.ratio <= bound),
                f"x{row.ratio:.2f}",
            )
        )
    if not real:
        out.append(
            Verdict("freeGpus on a cluster loaded through the API", NOT_MEASURED,
                    "the real_cluster section did not run")
        )  # fmt: skip
    return out


def targets(rows: list[Row]) -> list[str]:
    """Every target as one line: met, NOT met, or not measured in this run."""
    return [v.line() for v in verdicts(rows)]


RESULTS_START = "<!-- results:start"
RESULTS_END = "<!-- results:end -->"


class ResultsPageError(Exception):
    """The results page cannot take the table; the message names the file and what is missing."""


def check_results_page(text: str, path: str) -> None:
    """Refuse a page without the markers before a run, not after it."""
    start, end = text.find(RESULTS_START), text.find(RESULTS_END)
    if start == -1 or end == -1 or end < start:
        raise ResultsPageError(
            f"{path} has no '{RESULTS_START} ... -->' and '{RESULTS_END}' lines around its "
            "current results: the table is written between them"
        )


# Where every figure of the run is written, relative to the results page's
# folder: three sizes of figures are well over a hundred rows, and the page
# is the targets and what limits them (issue 33: at most 200 lines).
FIGURES_PAGE = "docs/reference/benchmark-figures.md"


def _header(command: str, commit: str, machine: str, when: str) -> str:
    return f"**Commit** `{commit}`, **date** {when}, **machine** {machine}."


def results_section(results: Results, *, command: str, commit: str, machine: str, when: str) -> str:
    """The current results: the run, every target and its status, the notes, a link to the figures."""
    lines = [
        f"{RESULTS_START}: written by `{command}`; edit the text around it, not this -->",
        "",
        _header(command, commit, machine, when),
        "",
        "| target | status | figures |",
        "| --- | --- | --- |",
    ]
    lines.extend(f"| {v.target} | {v.status} | {v.figures} |" for v in verdicts(results.rows))
    lines.extend(
        [
            "",
            f"Every figure of this run, median (min-max) of its rounds, with its baseline: "
            f"[{FIGURES_PAGE}]({FIGURES_PAGE}).",
        ]
    )
    if results.notes:
        lines.append("")
        lines.extend(f"- {n}" for n in results.notes)
    lines.extend(["", RESULTS_END])
    return "\n".join(lines)


def figures_page(results: Results, *, command: str, commit: str, machine: str, when: str) -> str:
    """Every figure of the run, as the page FIGURES_PAGE; written whole by the same command."""
    lines = [
        "# Benchmark figures",
        "",
        f"Written by `{command}` with the current results of "
        # Plain text, not a link: the page is part of the docs site, which
        # holds no file outside docs/ (mkdocs build --strict refuses the link).
        "BENCHMARKS.md at the repository's root, which says how to read them and what "
        "limits each; do not edit by hand.",
        "",
        _header(command, commit, machine, when),
        "",
        "| nodes | figure | service | baseline | ratio | note |",
        "| ---: | --- | --- | --- | ---: | --- |",
    ]
    for r in results.rows:
        ratio = "-" if math.isnan(r.ratio) else f"{r.ratio:.2f}x"
        baseline = f"{r.baseline_name}: {spread(r.baseline)}" if r.baseline else "-"
        note = r.note.replace("|", "/") or "-"
        lines.append(
            f"| {r.size:,} | {r.name} | {spread(r.value)} {r.unit} | {baseline} | {ratio} | {note} |"
        )
    return "\n".join(lines) + "\n"


def write_results_page(text: str, section: str, path: str) -> str:
    """The page with its current results replaced by `section`; the rest kept as written."""
    check_results_page(text, path)
    start = text.index(RESULTS_START)
    end = text.index(RESULTS_END) + len(RESULTS_END)
    return text[:start] + section + text[end:]
