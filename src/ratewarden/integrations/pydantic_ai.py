"""pydantic-ai-middleware: ask ratewarden in `before_tool_call`, settle after the tool.

    from pydantic_ai import Agent
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai_middleware import MiddlewareToolset
    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    tools = MiddlewareToolset(
        wrapped=FunctionToolset([terminal]), middleware=[RatewardenMiddleware()]
    )
    agent = Agent(model, deps_type=Deps, toolsets=[tools])
    await agent.run(prompt, deps=Deps(user_id="discord:77"))

The user is `deps.user_id` (a key of a dict, or an attribute), or what `user(deps)`
returns; `tool_args` go with the check whenever the daemon's policy reads them. A
refused call reaches the model as the tool's result
`Tool 'terminal' blocked: Rate limit: max 10 terminal calls per minute (retry in 42s)`.
A rule with `on_exceed: ask` gives `ToolDecision.ASK`: the toolset's `permission_handler`
decides, and without one the call is blocked with the same message. The middleware hears
of an approval only when the tool has run, so it records it (`approved: true`) then.

pydantic-ai-middleware 0.2.4 passes the hooks no tool-call id, so the call id is a fresh
`pydantic-ai~<16 hex digits>` (led by `ctx.tool_call_id` if a context ever carries it).
The settle in `after_tool_call` (or `on_tool_error`) finds it again through a context
variable, which holds because the toolset runs before, the tool and after in one task,
and each of a turn's parallel calls in a task of its own.
A call the daemon answered with `send_result` (a loop rule keyed on results) is settled
with the digest of the `result` that `after_tool_call` receives.

The module imports without the framework (ratewarden never imports it); the hooks import
what they return when the framework calls them.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards, check_call, log
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall
from ratewarden.vocabulary import CallStatus

try:
    from pydantic_ai_middleware import AgentMiddleware
except ImportError:  # the module imports without it; only MiddlewareToolset(...) needs it
    AgentMiddleware = object

__all__ = ["RatewardenMiddleware"]
HOST = "pydantic-ai"  # leads the call id: the hooks get no tool-call id


@dataclass(frozen=True)
class _Admitted:
    """An allowed (or asked) call waiting for its tool to finish, with what the approval's
    check needs again."""

    call: AdmittedCall  # its guard, id and start
    user: str
    tool: str
    asked: bool  # went through on the permission handler's approval
    args: object = field(default=None, repr=False)  # for the approval's check; never shown


class RatewardenMiddleware(AgentMiddleware):  # type: ignore[misc,unused-ignore]
    """Allow, deny or ask for each tool call by the daemon's rules for the user in `deps`.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `user`: a callable from deps to the user id (default: the
    `user_id` key or attribute of deps, else RATEWARDEN_USER or the login name); `fail`:
    "open" (default) or "closed" when the daemon cannot be reached (only without `guard`:
    an `AsyncGuard` carries its own). Put it last in the middleware list: a middleware
    after it that blocks a call it allowed leaves the call's slot held until its lease
    times out.
    """

    def __init__(
        self,
        guard: AsyncGuard | None = None,
        *,
        user: UserLookup | None = None,
        fail: str | None = None,
    ) -> None:
        self._guards = LoopGuards(guard, fail)
        self._user = user
        # One variable per instance, so two ratewarden middlewares never read each other's.
        self._admitted: contextvars.ContextVar[_Admitted | None] = contextvars.ContextVar(
            f"ratewarden_pydantic_ai_{id(self):x}", default=None
        )

    async def before_tool_call(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        deps: Any,
        ctx: Any = None,
    ) -> Any:
        from pydantic_ai_middleware import ToolDecision, ToolPermissionResult

        self._admitted.set(None)
        guard = self._guards.get()
        user = resolve_user(deps, self._user)
        call_id = vocabulary.call_id(HOST, getattr(ctx, "tool_call_id", None))
        answer = await check_call(guard, user=user, tool=tool_name, call_id=call_id, args=tool_args)
        if answer.decision == "deny":
            return ToolPermissionResult(decision=ToolDecision.DENY, reason=answer.message)
        asked = answer.decision == "ask"
        # A fail-open answer holds nothing, unless the daemon counted it locally (holds).
        if answer.holds or not answer.degraded:
            call = AdmittedCall(call_id, guard, send_result=answer.send_result)
            admitted = _Admitted(call, user, tool_name, asked, tool_args)
            self._admitted.set(admitted)
        if asked:
            return ToolPermissionResult(decision=ToolDecision.ASK, reason=answer.message)
        return ToolPermissionResult(decision=ToolDecision.ALLOW)

    async def after_tool_call(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        result: Any,
        deps: Any,
        ctx: Any = None,
    ) -> Any:
        await self._finish(tool_name, CallStatus.OK, result)
        return result

    async def on_tool_error(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        error: Exception,
        deps: Any,
        ctx: Any = None,
    ) -> Exception | None:
        await self._finish(tool_name, CallStatus.ERROR)
        return None

    async def _finish(self, tool_name: str, status: CallStatus, result: Any = NO_RESULT) -> None:
        admitted = self._admitted.get()
        if admitted is None or admitted.tool != tool_name:
            return
        self._admitted.set(None)
        if admitted.asked and not await self._record_approval(admitted):
            return
        call = admitted.call
        await call.guard.settle(call.call_id, call.settlement(status, result))

    async def _record_approval(self, admitted: _Admitted) -> bool:
        """The handler approved an ask and the tool ran: count it as an approved call
        (whose answer, not the ask's, says whether to settle it with a result digest)."""
        answer = await check_call(
            admitted.call.guard,
            user=admitted.user,
            tool=admitted.tool,
            call_id=admitted.call.call_id,
            approved=True,
            args=admitted.args,
        )
        if not answer.allowed:  # a deny rule filled up meanwhile; the tool already ran
            log.warning("approved %s call not recorded: %s", admitted.tool, answer.message)
        admitted.call.send_result = answer.send_result
        return answer.allowed and not answer.degraded
