"""The HTTP transport ratewarden owns, for the daemon, the MCP gateway, the client and hooks.

Each module opens with why a library does not serve and the benchmark row that re-checks
it. Imports only the shared words; `exchange` (the command hook's) only the standard library.
"""
