"""Settings, from `RATEWARDEN_*` environment variables or the command line's flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from ratewarden.http.settings import ConnectionSettings
from ratewarden.limiter.algorithms.budget import MAX_SWEEP_INTERVAL_S
from ratewarden.limiter.script import MAX_SPEND_RETENTION_DAYS, SPEND_RETENTION_DAYS
from ratewarden.policy.schema import webhook_url
from ratewarden.vocabulary import DEFAULT_HOST, DEFAULT_PORT

TokenList = Annotated[list[str], NoDecode]


class Settings(ConnectionSettings):
    """Every knob of the daemon. Lists are comma-separated in the environment. (Its clients'
    RATEWARDEN_URL and RATEWARDEN_TOKEN are `vocabulary.ClientSettings`.)

    The connection guard's two (`request_timeout_s`, `max_connections`) are declared with the
    guard, in `ConnectionSettings`: the MCP gateway reads them too.
    """

    model_config = SettingsConfigDict(env_prefix="RATEWARDEN_", extra="ignore", frozen=True)

    # Where counters live: memory:// (embedded, one process), redis://, rediss://, unix://.
    store_url: str = "memory://"
    # Policy file; unset means ./ratewarden.yaml if present, else the packaged example.
    policy: Path | None = None
    # Loopback by default: nothing is exposed until an operator says so.
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    # Bearer tokens: `check` role (check, settle, usage), `viewer` role (read the console's
    # figures: stats, usage, refusals, the policy, runtime overrides) and `admin` role
    # (everything). A token is in one list only.
    # None configured: auth is off and `serve` listens on loopback only. A check token is
    # a service token: it vouches for the users it names (a gateway that authenticated
    # them), any user unless API_TOKEN_USERS limits it.
    api_tokens: TokenList = Field(default_factory=list)
    admin_tokens: TokenList = Field(default_factory=list)
    viewer_tokens: TokenList = Field(default_factory=list)
    # The users each API token may name, one entry per token in their order: globs
    # separated by spaces (`team-a-* bot-7`); `*`, or no entry, is any user.
    api_token_users: TokenList = Field(default_factory=list)
    # Users' own tokens: a file in the MCP gateway's tokens format (user: token, or a list
    # of tokens). A request with one acts as its user and no other. Read at start and on
    # every policy reload (a bad file on reload keeps the tokens in force).
    user_tokens: Path | None = None
    # Names of the admin tokens, in their order (RATEWARDEN_ADMIN_NAMES=ops-ana,ops-ben):
    # what the audit and the overrides list say set a change. Unnamed: "admin token N".
    admin_names: TokenList = Field(default_factory=list)
    # Allow `serve` on a non-loopback address with no tokens (something else guards it).
    insecure_no_auth: bool = False
    # Seconds between checks of the policy file for changes (reloaded when it changes);
    # 0 turns the watcher off (SIGHUP and POST /v1/admin/reload still reload).
    reload_interval_s: float = Field(2.0, ge=0, le=3600)
    # What to answer when the store is unreachable; overrides the policy's defaults.fail.
    fail: Literal["open", "closed"] | None = None
    # Longest wait for the store before deciding by the fail mode: a deadline on every
    # store operation (connect, retries and script reloads included). Time in which the
    # daemon itself was stalled, or the store answered other operations, does not count,
    # up to 10 times this in all (docs/operations.md, "A busy daemon is not a broken
    # store").
    store_timeout_ms: int = Field(100, ge=1, le=60_000)
    # Circuit breaker: after this many store failures in a row, stop calling the store
    # for a cool-down and decide by the fail mode at once; 0 turns the breaker off.
    store_breaker_failures: int = Field(5, ge=0, le=10_000)
    # How long the circuit stays open before one probe call (stretched by a random 0-20 %).
    store_breaker_cooldown_ms: int = Field(1000, ge=1, le=600_000)
    # Where the daemon keeps its files (today the memory store's state file). Unset:
    # $XDG_STATE_HOME/ratewarden, else ~/.local/state/ratewarden (the XDG base directory
    # for state), never the working directory, which may be a clone or /. Created, mode
    # 0700, when first needed. A relative path is relative to the working directory.
    data_dir: Path | None = None
    # The embedded memory:// store's state file: counters, budgets, call records and recent
    # denials survive a restart. Relative to DATA_DIR; "off" keeps them in memory only.
    # Saved every STATE_INTERVAL_S seconds (when changed) and at shutdown, so a crash
    # loses at most the last interval. Unused with Redis.
    state_file: str = "ratewarden-state.json"
    state_interval_s: float = Field(5.0, gt=0, le=3600)
    # Days each budget's spend of a day is kept in the store (GET /v1/admin/spend); 0 keeps
    # none. Written by the settle that charges it, in the same script (docs/operations.md).
    spend_retention_days: int = Field(SPEND_RETENTION_DAYS, ge=0, le=MAX_SPEND_RETENTION_DAYS)
    # Seconds between budget sweeps (service/sweep.py): one process of the fleet charges
    # the reservations that expired unsettled in scopes no call came back to, into the
    # budget and the day's spend record. 0 turns it off; at most 300 (a counter outlives
    # its last reservation by 15 minutes, three sweeps).
    sweep_interval_s: float = Field(60.0, ge=0, le=MAX_SWEEP_INTERVAL_S)
    log_format: Literal["json", "text"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Audit lines (one JSON object per deny, ask, shadow deny, approved ask): "-" for
    # stderr, a file path, or "off". Unset: stderr, unless stderr is a terminal, where
    # JSON lines would bury the log someone is reading (logs.configure_audit says so).
    audit_log: str | None = None
    # Include each call's `args` in audit lines. Off by default: args may hold secrets.
    audit_args: bool = False
    # Answer a rate refusal again from memory until its retry_after, without the store
    # (engine/refusals.py): a looping agent then costs Redis nothing. Such an answer lists
    # only the remembered refusals among the call's rules.
    remember_refusals: bool = True
    # Largest request body accepted, in bytes, counted as it arrives (chunked bodies too);
    # larger is a 413. 256 KiB holds a 100-call batch at ~2.5 kB per call, and one check
    # with the largest `args` allowed (64 KiB as JSON).
    max_body_bytes: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024)
    # The same for a host's own HTTP hook (`POST /v1/hooks/{host}`), which posts the tool's
    # whole input: a file Claude Code writes may be large. Past it the call is refused in
    # the host's own form (a host runs the call on a 413); each MiB read costs the daemon
    # about as much as a few normal checks (docs/benchmarks.md, "Worst bodies"), so the
    # cap bounds what one hook request can cost. The command hook has no such cap.
    max_hook_body_bytes: int = Field(128 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Envoy's rate limit service and external authorization (service/envoy/,
    # docs/envoy.md): a gRPC listener on this port, on `host`; unset: off. Needs the
    # `envoy` extra (grpcio, xds-protos).
    grpc_port: int | None = Field(None, ge=1, le=65535)
    # The request header external authorization reads the user from: one Envoy sets after
    # its own jwt_authn verified the client's token (claim_to_headers), never the client's.
    envoy_user_header: str = Field(
        "x-ratewarden-user", min_length=1, max_length=128, pattern=r"^[a-z0-9-]+$"
    )
    # Notifications (service/notify.py): one webhook, told of every event, beside the
    # policy's `notifications.webhooks`; and its HMAC secret (unset: posts go unsigned).
    webhook_url: str | None = None
    webhook_secret: str | None = None
    # Notes waiting for the notifier's worker, and posts waiting to be sent: each queue
    # holds at most this many; past it a notification is dropped and counted.
    notify_queue: int = Field(1000, ge=1, le=1_000_000)
    # Attempts per post (the first included), retried with backoff on a connection
    # error, a timeout, a 429 or a 5xx; and each attempt's timeout.
    webhook_attempts: int = Field(5, ge=1, le=20)
    webhook_timeout_s: float = Field(5.0, gt=0, le=60)

    @field_validator(
        "api_tokens", "admin_tokens", "viewer_tokens", "admin_names", "api_token_users",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_tokens", "admin_tokens", "viewer_tokens")
    @classmethod
    def _header_safe(cls, value: list[str]) -> list[str]:
        for token in value:
            if not all("!" <= char <= "~" for char in token):
                raise ValueError(
                    "a token must be printable ASCII without spaces (it travels in an HTTP header)"
                )
        return value

    @field_validator("api_token_users")
    @classmethod
    def _globs(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not entry.isprintable():
                raise ValueError(
                    "api_token_users: globs of printable characters, separated by spaces"
                )
        return value

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return webhook_url(value.strip())
        except ValueError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, value: str | None) -> str | None:
        if value is not None and not value:
            return None
        if value is not None and not value.isprintable():
            raise ValueError("printable characters only")
        return value

    @model_validator(mode="after")
    def _names_fit_tokens(self) -> Settings:
        if len(self.admin_names) > len(self.admin_tokens):
            raise ValueError(
                f"admin_names: {len(self.admin_names)} names for {len(self.admin_tokens)} "
                "admin tokens (one name per token, in their order)"
            )
        if len(self.api_token_users) > len(self.api_tokens):
            raise ValueError(
                f"api_token_users: {len(self.api_token_users)} entries for "
                f"{len(self.api_tokens)} API tokens (one entry per token, in their order)"
            )
        return self

    @model_validator(mode="after")
    def _one_role_per_token(self) -> Settings:
        """A token in two lists is refused, naming both (never the token): which role
        the operator meant cannot be guessed, and the wrong guess grants too much."""
        lists = {
            "RATEWARDEN_API_TOKENS": self.api_tokens,
            "RATEWARDEN_VIEWER_TOKENS": self.viewer_tokens,
            "RATEWARDEN_ADMIN_TOKENS": self.admin_tokens,
        }
        names = list(lists)
        for n, first in enumerate(names):
            for second in names[n + 1 :]:
                if set(lists[first]) & set(lists[second]):
                    raise ValueError(
                        f"a token is in both {first} and {second}: a token has one role "
                        "(check, viewer or admin); keep it in one list"
                    )
        return self

    def service_globs(self) -> list[tuple[str, ...] | None]:
        """Per API token, in order, the globs of the users it may name (None: anyone)."""
        globs: list[tuple[str, ...] | None] = []
        for n in range(len(self.api_tokens)):
            entry = self.api_token_users[n].split() if n < len(self.api_token_users) else ["*"]
            globs.append(None if "*" in entry else tuple(entry))
        return globs

    def state_path(self) -> Path | None:
        """The memory store's state file, or None when persistence is off."""
        text = self.state_file.strip()
        return None if text.lower() in ("", "off", "none") else self.data_path() / text

    def data_path(self) -> Path:
        """DATA_DIR, else the XDG state directory's `ratewarden` (a relative
        $XDG_STATE_HOME is ignored, as the XDG specification says)."""
        if self.data_dir is not None:
            return self.data_dir
        state_home = Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state")
        if not state_home.is_absolute():
            state_home = Path("~/.local/state")
        return state_home.expanduser() / "ratewarden"

    def policy_path(self) -> Path | None:
        """The policy file to load, or None for the packaged example."""
        if self.policy is not None:
            return self.policy
        local = Path("ratewarden.yaml")
        return local if local.is_file() else None
