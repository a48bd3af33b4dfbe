"""The fast path: routes that answer ordinary GraphQL requests without Strawberry's view.

The map (which route answers what, and why each is exact) is front_door.py's
docstring; the switch that turns all of it off is switch.py.
"""
