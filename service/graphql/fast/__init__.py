"""The fast path: routes that answer ordinary GraphQL requests without Strawberry's view.

The map (which route answers what, and why each is exact) is front_door.py's
docstring; the one way in is install.py, called by the app when it is built
with the switch (switch.py) on. Nothing outside this package imports it at
load time, so the service runs, and answers the same, without it.
"""
