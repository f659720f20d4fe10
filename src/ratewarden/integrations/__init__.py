"""Adapters for host agent frameworks: each asks the daemon before a tool runs.

One module per host, each importing its framework lazily (install the matching extra,
e.g. `ratewarden[strands]`). Every adapter talks to the daemon through
`ratewarden.client.Guard`/`AsyncGuard` (never to Redis), reads RATEWARDEN_URL and
RATEWARDEN_TOKEN when not given a guard, and fails open when the daemon is unreachable
unless told `fail="closed"`. See docs/integrations.md.
"""
