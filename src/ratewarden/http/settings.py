"""The connection guard's settings (http/connections.py), apart from the guard itself so
that reading them loads no server: the daemon's `Settings` extend them, and the MCP gateway
reads them from the same `RATEWARDEN_*` variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConnectionSettings(BaseSettings):
    """The guard's settings, read by the daemon (its `Settings` extend these) and the MCP
    gateway from the same `RATEWARDEN_*` variables."""

    model_config = SettingsConfigDict(env_prefix="RATEWARDEN_", extra="ignore", frozen=True)

    # Seconds a connection has to deliver a whole request (headers and body), counted from
    # its opening or from its previous answer; past it, the connection is closed. Without
    # it a silent or slow socket held a file descriptor for ever (http/connections.py).
    request_timeout_s: float = Field(5.0, gt=0, le=300)
    # Open connections per process; past it, a new one gets a 503 and is closed at once.
    # Unset: the open-file limit (ulimit -n) minus what the daemon keeps for its own files
    # (a quarter of the limit, at least 64). A larger value is lowered to that, with a warning.
    max_connections: int | None = Field(None, ge=1, le=1 << 20)
