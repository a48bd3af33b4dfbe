"""Counting the SQL statements a request sends (the count_statements fixture)."""

from __future__ import annotations

from typing import Any


class StatementCounter:
    def __init__(self) -> None:
        self.count = 0
        self.statements: list[str] = []
        # Transactions opened on asyncpg's pool (their BEGIN is not a statement here).
        self.transactions = 0

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement == "BEGIN":
            self.transactions += 1
            return
        self.count += 1
        self.statements.append(statement)
