"""The schema's root fields, by what they are about: queries, node and GPU mutations,
allocation and placement, events, subscriptions, token administration.

Each resolver translates: it reads the arguments, calls one domain function
(service/fleet/, service/scheduling/, service/access_control/,
service/event_log/) and wraps what it returns in the types of
service/graphql/types.py. schema.py puts them together.
"""
