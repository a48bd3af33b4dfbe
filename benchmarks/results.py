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
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"
