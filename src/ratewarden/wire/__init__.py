"""What crosses the wire between a host and the daemon, read the same way on both sides.

`bounded`: JSON read within caps (standard library); `bodies`: the v1 API's request and
response bodies (pydantic); `names`: a host's tool names and arguments as a call;
`tokens`: the tokens file the daemon and the MCP gateway both read. Imports only the
shared words (`ratewarden.vocabulary`, `arguments`, `errors`).
"""
