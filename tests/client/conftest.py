"""The in-process service with an in-memory span exporter (tests/support/traces.py), for the traces' tests in this folder."""

from tests.support.traces import traced  # noqa: F401  (the fixture)
