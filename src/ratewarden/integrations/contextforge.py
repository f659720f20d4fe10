"""IBM ContextForge MCP gateway: a plugin that asks ratewarden before every tool call.

In the gateway's plugins/config.yaml (with PLUGINS_ENABLED=true):

    plugins:
      - name: ratewarden
        kind: ratewarden.integrations.contextforge.RatewardenPlugin
        hooks: ["tool_pre_invoke", "tool_post_invoke"]
        mode: sequential
        priority: 1000                 # last: a call another plugin blocks is never counted
        config:
          url: http://127.0.0.1:8470   # else RATEWARDEN_URL; the token: RATEWARDEN_TOKEN
          fail: open                   # or closed: refuse while the daemon is unreachable

`tool_pre_invoke` checks the call with the daemon. A refusal becomes a `PluginViolation`
whose reason is ratewarden's sentence; the gateway raises it as `PluginViolationError`,
and its MCP transport answers the `tools/call` with a `CallToolResult` (`isError: true`)
whose text is `tool_pre_invoke blocked by plugin ratewarden: RATEWARDEN - <sentence>
(ratewarden policy)`: the model reads it as the tool's result. An `ask` is refused the same way,
its sentence saying a human's approval is needed (the gateway has no one to ask).
`tool_post_invoke` settles the call: its duration, and `status: error` when the tool's
result is an error (`isError`); when the daemon asks for it (`send_result`: a loop rule
keyed on results), the digest of the result's `content`, `structuredContent` and
`isError`, as the MCP proxy and gateway digest a `CallToolResult`.

The user is the gateway's authenticated identity: `context.user_email` (the JWT's email,
or its `sub`), else (no identity, or the gateway's `unknown` for an unauthenticated caller)
`default_user` from the config, else RATEWARDEN_USER or the login name.
The tool is the upstream server's own name for it (`original_name`, `terminal`), or the
gateway's prefixed name (`local-terminal`) with `tool_name: gateway`. Its metadata comes
from the annotations the server published (`readOnlyHint`, `destructiveHint`...), which
the gateway hands the plugin in `global_context.metadata["tool"]`. The call's arguments
go with the check whenever the daemon's policy reads them.

The module imports without the gateway: `cpex` (its plugin framework) is imported only
when the gateway loads the plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard, ClientError, unreachable_answer
from ratewarden.integrations._async import LoopGuards
from ratewarden.integrations._identity import default_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall, call_tool_result
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, ToolMetadata
from ratewarden.wire.names import check_request

try:
    from cpex.framework import Plugin
except ImportError:  # the module imports without the gateway
    Plugin = object

__all__ = ["RatewardenPlugin", "refusal"]
HOST = "contextforge"  # leads the call id: the hooks get no tool-call id
VIOLATION_CODE = "RATEWARDEN"
DESCRIPTION = "ratewarden policy"  # the gateway shows it in parentheses after the reason
ANONYMOUS = "unknown"  # the gateway's user for a caller it did not authenticate
_STATE_KEY = "ratewarden"  # in the plugin's per-request context.state


@dataclass(frozen=True)
class PluginSettings:
    """The plugin's `config:` block."""

    url: str | None = None
    token: str | None = None
    fail: str | None = None
    default_user: str | None = None
    tool_name: str = "original"  # or "gateway"

    @classmethod
    def read(cls, config: Mapping[str, Any] | None) -> PluginSettings:
        given = dict(config or {})
        tool_name = str(given.get("tool_name") or "original")
        if tool_name not in ("original", "gateway"):
            raise ValueError("tool_name must be 'original' or 'gateway'")
        return cls(
            url=_text(given.get("url")),
            token=_text(given.get("token")),
            fail=_text(given.get("fail")),
            default_user=_text(given.get("default_user")),
            tool_name=tool_name,
        )


class RatewardenPlugin(Plugin):  # type: ignore[misc,unused-ignore]
    """A ContextForge plugin: `tool_pre_invoke` checks, `tool_post_invoke` settles."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = PluginSettings.read(getattr(config, "config", None))
        guard = None
        if self.settings.url or self.settings.token:
            guard = AsyncGuard(
                self.settings.url, self.settings.token, fail=self.settings.fail or "open"
            )
        self._guards = LoopGuards(guard, None if guard else self.settings.fail)

    async def tool_pre_invoke(self, payload: Any, context: Any) -> Any:
        from cpex.framework import PluginViolation, ToolPreInvokeResult

        context.state.pop(_STATE_KEY, None)
        guard = self._guards.get()
        tool = self.tool_name(payload.name, context)
        call_id = vocabulary.call_id(HOST)
        answer = await self._check(guard, self.user(context), tool, call_id, payload, context)
        if answer.decision != "allow":
            reason = refusal(answer, tool)
            violation = PluginViolation(
                reason=reason,
                description=DESCRIPTION,
                code=VIOLATION_CODE,
                details=_details(answer),
            )
            return ToolPreInvokeResult(continue_processing=False, violation=violation)
        # A fail-open answer holds nothing, unless the daemon counted it locally (holds).
        if answer.holds or not answer.degraded:
            context.state[_STATE_KEY] = AdmittedCall(call_id, guard, send_result=answer.send_result)
        return ToolPreInvokeResult(continue_processing=True)

    async def tool_post_invoke(self, payload: Any, context: Any) -> Any:
        from cpex.framework import ToolPostInvokeResult

        admitted = context.state.pop(_STATE_KEY, None)
        if isinstance(admitted, AdmittedCall):
            result = payload.result
            status = CallStatus.ERROR if _is_error(result) else CallStatus.OK
            digested = call_tool_result(result) if admitted.send_result else NO_RESULT
            await admitted.guard.settle(admitted.call_id, admitted.settlement(status, digested))
        return ToolPostInvokeResult(continue_processing=True)

    def user(self, context: Any) -> str:
        """The gateway's authenticated user (its email), else the configured default."""
        found = getattr(context, "user_email", None)
        if isinstance(found, str) and found and found != ANONYMOUS:
            return found
        return self.settings.default_user or default_user()

    def tool_name(self, called: str, context: Any) -> str:
        """The upstream server's own tool name, unless configured to use the gateway's."""
        if self.settings.tool_name == "gateway":
            return called
        original = getattr(_tool(context), "original_name", None)
        return original if isinstance(original, str) and original else called

    async def _check(
        self, guard: AsyncGuard, user: str, tool: str, call_id: str, payload: Any, context: Any
    ) -> CheckResponse:
        try:
            request = check_request(
                user=user,
                tool=tool,
                call_id=call_id,
                metadata=tool_metadata(_tool(context)),
                args=payload.args,
            )
            return await guard.check(request)
        except (ClientError, ValueError) as exc:  # bad input or auth: answered by the fail mode
            unsent = CheckRequest.model_construct(user=user, tool=tool, call_id=call_id)
            return unreachable_answer(unsent, guard.fail, exc)


def refusal(answer: CheckResponse, tool: str) -> str:
    """What the model reads: ratewarden's sentence; for an ask, that a human must approve."""
    message = answer.message or vocabulary.REFUSED.format(tool=tool)
    return vocabulary.needs_approval(message) if answer.decision == "ask" else message


def tool_metadata(tool: Any) -> ToolMetadata | None:
    """The MCP annotations the server published for the tool, as ratewarden's metadata."""
    annotations = getattr(tool, "annotations", None)
    if not isinstance(annotations, Mapping):
        return None
    found = vocabulary.hint_flags(annotations)
    return ToolMetadata(**found) if found else None


def _tool(context: Any) -> Any:
    """The gateway's record of the tool (`mcpgateway.common.models.Tool`), if it gave one."""
    metadata = getattr(getattr(context, "global_context", None), "metadata", None)
    return metadata.get("tool") if isinstance(metadata, Mapping) else None


def _is_error(result: Any) -> bool:
    if isinstance(result, Mapping):
        return bool(result.get("isError") or result.get("is_error"))
    return bool(getattr(result, "is_error", False) or getattr(result, "isError", False))


def _details(answer: CheckResponse) -> dict[str, Any]:
    details: dict[str, Any] = {"decision": answer.decision}
    if answer.violations:
        details["rules"] = [violation.rule for violation in answer.violations]
    if answer.retry_after is not None:
        details["retry_after"] = answer.retry_after
    return details


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None
