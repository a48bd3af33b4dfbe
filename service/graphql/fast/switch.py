"""The one switch: INVENTORY_FAST_PATH (Settings.fast_path).

Off, the app neither imports nor installs the fast path (service/web/app.py,
install.py): no front door, the schema's own execution context, Strawberry's
own input conversion. Every request is then answered by Strawberry alone,
the reference the fast path is compared with.

The hooks install.py puts on the schema stay for the process, so each one
also asks the request's settings here: an app built switched off in a
process where another was built switched on (the tests' reference app) is
still Strawberry's alone.
"""

from __future__ import annotations

from service.config import Settings


def enabled(context: object) -> bool:
    """Whether fast code may run for the request whose GraphQL context this is.

    The service's contexts carry their settings; a context that is not the
    service's (a test's own schema, no context at all) is not switched off.
    """
    settings = getattr(context, "settings", None)
    return not isinstance(settings, Settings) or settings.fast_path
