"""`ratewarden mcp`: every MCP `tools/call` checked with the daemon, any client.

`guard.py` holds what a session needs (the tools' annotations, the check, the ask, the
settle) and knows no transport; `relay.py` passes one session's messages between a
client and a server, intercepting only `tools/call`; `proxy.py` is the command for one
client over stdio. Nothing in ratewarden imports this package unless `ratewarden mcp`
runs, and it imports nothing of the daemon's side.
"""
