"""The browser tests' service (tests/support/dashboard.py), for the dashboard's tests in this folder."""

from tests.support.dashboard import service  # noqa: F401  (the fixture)
