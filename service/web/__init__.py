"""The HTTP side: the Starlette app, its routes, guards and pages.

Kept apart from the domain modules in service/, which never import starlette
or strawberry; this package and service/graphql/ are the only ones that do.
"""
