"""Settings, from `RATEWARDEN_*` environment variables or the command line's flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_PORT = 8470
TokenList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """Every knob of the daemon and its clients. Lists are comma-separated in the environment."""

    model_config = SettingsConfigDict(env_prefix="RATEWARDEN_", extra="ignore", frozen=True)

    # Where counters live: memory:// (embedded, one process), redis://, rediss://, unix://.
    store_url: str = "memory://"
    # Policy file; unset means ./ratewarden.yaml if present, else the packaged example.
    policy: Path | None = None
    # Loopback by default: nothing is exposed until an operator says so.
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    api_tokens: TokenList = []
    admin_tokens: TokenList = []
    # What to answer when the store is unreachable; overrides the policy's defaults.fail.
    fail: Literal["open", "closed"] | None = None
    # Longest wait for the store before deciding by the fail mode.
    store_timeout_ms: int = Field(100, ge=1, le=60_000)
    log_format: Literal["json", "text"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Audit lines (one JSON object per deny, ask, shadow deny, approved ask): "-" for
    # stderr, a file path, or "off".
    audit_log: str = "-"
    # Include each call's `args` in audit lines. Off by default: args may hold secrets.
    audit_args: bool = False
    # Clients (CLI, hooks, adapters): where the daemon is, and the token to send.
    url: str = f"http://127.0.0.1:{DEFAULT_PORT}"
    token: str | None = None

    @field_validator("api_tokens", "admin_tokens", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def policy_path(self) -> Path | None:
        """The policy file to load, or None for the packaged example."""
        if self.policy is not None:
            return self.policy
        local = Path("ratewarden.yaml")
        return local if local.is_file() else None
