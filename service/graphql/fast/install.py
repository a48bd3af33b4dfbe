"""The one way in to the fast path: its hooks installed on the schema, and its front door.

The schema's modules do not import the fast package. The app, when it is
built with INVENTORY_FAST_PATH on (service/web/app.py), calls install:

- the schema's execution context gains plain-field completion
  (execution.py) beneath the schema's own (pages.PageTruncation stays
  first, so the value completed next is a plain list);
- every input type builds its values through a compiled plan
  (input_conversion.py);
- the front door (front_door.py) is made, for the GraphQL endpoint to ask
  before Strawberry's view.

Switched off, nothing here is imported and Strawberry's own code answers
everything. The hooks stay installed for the process: each one asks the
request's settings (switch.py) before doing anything, so an app built
switched off in the same process (the tests' reference app) still gets
Strawberry's own behaviour.
"""

from __future__ import annotations

from collections.abc import Callable

import strawberry
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings

from .execution import PlainFieldExecutionContext
from .front_door import FrontDoor
from .input_conversion import install_input_plans


def install(
    schema: strawberry.Schema, engine: Callable[[], AsyncEngine], settings: Settings
) -> FrontDoor:
    """Install the fast path's hooks on `schema` (once per schema) and make its front door."""
    executor = schema.execution_context_class
    if not issubclass(executor, PlainFieldExecutionContext):
        schema.execution_context_class = type(
            f"{executor.__name__}WithPlainFields", (executor, PlainFieldExecutionContext), {}
        )
    install_input_plans(schema)
    return FrontDoor(schema, engine, settings)
