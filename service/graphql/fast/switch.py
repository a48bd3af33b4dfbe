"""The one switch: INVENTORY_DIRECT_EXECUTION (Settings.direct_execution).

Off, no fast route runs: the app has no front door (service/web/app.py), the
execution context completes every field the stock way (execution.py) and
input objects are built by Strawberry's own conversion (input_conversion.py).
Every request is then answered by Strawberry alone, the reference the fast
path is compared with.
"""

from __future__ import annotations

from service.config import Settings


def enabled(context: object) -> bool:
    """Whether fast code may run for the request whose GraphQL context this is.

    The service's contexts carry their settings; a context that is not the
    service's (a test's own schema, no context at all) is not switched off.
    """
    settings = getattr(context, "settings", None)
    return not isinstance(settings, Settings) or settings.direct_execution
