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
        verdicts = targets(self.rows)
        if verdicts:
            out.extend(["", "Targets (issue 7):", ""])
            out.extend(f"- {v}" for v in verdicts)
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"


def _find(rows: list[Row], size: int, prefix: str) -> Row | None:
    return next((r for r in rows if r.size == size and r.name.startswith(prefix)), None)


def targets(rows: list[Row]) -> list[str]:
    """Issue 7's targets, each with the figures it was judged on (skipped when not measured)."""
    out: list[str] = []
    sizes = sorted({r.size for r in rows})

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    free = "freeGpus(H100-80GB, minFree 4, first 50) p50"
    at10k = _find(rows, 10_000, f"{free} vs the naive aggregate")
    if at10k is not None and at10k.baseline is not None:
        ok = at10k.value.median <= 0.5 * at10k.baseline.median
        out.append(
            f"freeGpus p50 at 10k nodes <= 0.5x the naive aggregate: {verdict(ok)} "
            f"({fmt(at10k.value.median)} ms vs {fmt(at10k.baseline.median)} ms, x{at10k.ratio:.2f})"
        )
    small, large = _find(rows, 1_000, free), _find(rows, 100_000, free)
    if small is not None and large is not None:
        ok = large.value.median <= 2 * small.value.median
        out.append(
            f"freeGpus p50 at 100k <= 2x at 1k: {verdict(ok)} ({fmt(large.value.median)} ms vs "
            f"{fmt(small.value.median)} ms)"
        )
    for size in sizes:
        reg = _find(rows, size, "registerNode, changed")
        if reg is not None:
            out.append(
                f"{size:,} nodes: registration >= 0.5x raw asyncpg: {verdict(reg.ratio >= 0.5)} "
                f"(x{reg.ratio:.2f})"
            )
        for name, tokens in (("heartbeat, 64 agents", ""),
                             ("heartbeat with", ", agents' own tokens")):  # fmt: skip
            beat = _find(rows, size, name)
            if beat is not None:
                out.append(
                    f"{size:,} nodes: heartbeats >= 5,000/s{tokens}: "
                    f"{verdict(beat.value.median >= 5000)} ({fmt(beat.value.median)}/s)"
                )
        nvlink = _find(rows, size, "place 1x H100-80GB with nvlinkShards")
        if nvlink is not None and size == 10_000:
            out.append(
                f"{size:,} nodes: place with nvlinkShards >= 0.8x place without (issue 20): "
                f"{verdict(nvlink.ratio >= 0.8)} (x{nvlink.ratio:.2f})"
            )
        place = _find(rows, size, "place 1x H100-80GB, ")
        if place is not None:
            out.append(
                f"{size:,} nodes: place >= 1,500 claims/s: "
                f"{verdict(place.value.median >= 1500)} ({fmt(place.value.median)}/s)"
            )
        churn = _find(rows, size, "freeGpus p50 after")
        if churn is not None:
            out.append(
                f"{size:,} nodes: freeGpus after unchanged churn <= 1.2x before: "
                f"{verdict(churn.ratio <= 1.2)} (x{churn.ratio:.2f})"
            )
        for row in rows:
            if row.size != size or not row.name.startswith("real cluster, "):
                continue
            # Issue 30: the whole answer at most 1x the naive SQL, first 50 at most 0.5x.
            bound = 1.0 if "whole answer" in row.name else 0.5
            out.append(
                f"{size:,} nodes: {row.name.removesuffix(' p50')} <= {bound}x the naive SQL: "
                f"{verdict(row.ratio <= bound)} (x{row.ratio:.2f})"
            )
        peer = next(
            (r for r in rows if r.size == size and "req/s" in r.name and "PostGraphile" in r.name),
            None,
        )
        if peer is not None:
            out.append(
                f"{size:,} nodes: full page req/s >= PostGraphile 5: {verdict(peer.ratio >= 1)} "
                f"(x{peer.ratio:.2f})"
            )
    return out
