"""Google ADK: a plugin that asks ratewarden before every tool call and settles after it.

    from google.adk.runners import InMemoryRunner
    from ratewarden.integrations.adk import RatewardenPlugin

    runner = InMemoryRunner(agent=agent, plugins=[RatewardenPlugin()])

The user is the session's `user_id` (`tool_context.user_id`), or what `user(tool_context)`
returns; the call's arguments go with the check whenever the daemon's policy reads them.
A refused call never runs: `before_tool_callback` returns `{"error": <our message>}`,
which ADK hands to the model as the function response, e.g.
`{"error": "Rate limit: max 10 terminal calls per minute (retry in 42s)"}`.

A rule with `on_exceed: ask` goes through ADK's tool confirmation: the call asks for one
(`tool_context.request_confirmation`, the daemon's reason as the hint) and pauses the run,
as ADK's own `require_confirmation` gate does; the app answers the
`adk_request_confirmation` call, and ADK runs the call again with the answer. Confirmed,
it is checked again with `approved: true`, so it is counted and audited as approved;
rejected, it is refused with the daemon's reason. A confirmation the tool asked for itself
(`require_confirmation`) approves nothing of ratewarden's. With `confirm=False`, or in a
context that cannot ask (no function call id), an `ask` is a refusal saying a human must
approve the call.

An allowed call is settled in `after_tool_callback` (duration, `ok`, and the digest of the
tool's response when the daemon asks for it, `send_result`; `blocked` and no charge when
the call only paused for a confirmation) or released by
`on_tool_error_callback` (`error`, also when the call was cancelled). Each call has a
`ToolContext` of its own, so parallel calls are settled one by one. The call id is led by
the model's function call id. The module imports without ADK (ratewarden never imports
it); the plugin needs it.
"""

from __future__ import annotations

import weakref
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall
from ratewarden.vocabulary import CallStatus

try:
    from google.adk.plugins import BasePlugin
except ImportError:  # the module imports (and the plugin builds) without ADK

    class BasePlugin:  # type: ignore[no-redef]
        """What RatewardenPlugin needs of ADK's BasePlugin: a name."""

        def __init__(self, name: str) -> None:
            self.name = name


__all__ = ["RatewardenPlugin"]
HOST = "adk"  # leads the call id when a call has no function call id
# The function call ADK makes for a confirmation request (google.adk.utils.
# _function_call_names.REQUEST_CONFIRMATION_FUNCTION_CALL_NAME, a private module).
CONFIRMATION_CALL = "adk_request_confirmation"

Response = dict[str, Any]


class RatewardenPlugin(BasePlugin):  # type: ignore[misc,unused-ignore]
    """Allow, refuse or ask for each tool call by the daemon's rules for the session's user.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `user`: a callable from the `ToolContext` to the user id (default:
    `tool_context.user_id`, else RATEWARDEN_USER or the login name); `fail`: "open"
    (default) or "closed" when the daemon cannot be reached (only without `guard`: an
    `AsyncGuard` carries its own); `confirm`: ask a human through ADK's tool confirmation
    (default) or refuse an `ask`. List it first among the runner's plugins: ADK stops at
    the first plugin whose after-tool callback returns a value, and the settle is there.
    """

    def __init__(
        self,
        guard: AsyncGuard | None = None,
        *,
        user: UserLookup | None = None,
        fail: str | None = None,
        confirm: bool = True,
        name: str = "ratewarden",
    ) -> None:
        super().__init__(name=name)
        self._guards = LoopGuards(guard, fail)
        self._user = user
        self._confirm = confirm
        # Allowed calls by their ToolContext: ADK hands the same one to the before, after
        # and error callbacks of one call, and a call that never ends is forgotten with it.
        self._admitted: weakref.WeakKeyDictionary[Any, AdmittedCall] = weakref.WeakKeyDictionary()

    async def before_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any
    ) -> Response | None:
        confirmation = tool_context.tool_confirmation  # the human's answer, on a re-run
        asked = None if confirmation is None else _our_question(tool_context, tool.name)
        if asked is not None and not confirmation.confirmed:
            return _refused(asked)
        guard = self._guards.get()
        call_id = vocabulary.call_id(HOST, tool_context.function_call_id)
        answer = await check_call(
            guard,
            user=resolve_user(tool_context, self._user),
            tool=tool.name,
            call_id=call_id,
            approved=asked is not None,
            args=tool_args,
        )
        if answer.decision == "ask" and asked is None:
            return self._ask(tool.name, tool_context, answer.message)
        if not answer.allowed:
            return _refused(answer.message)
        # A fail-open answer holds nothing, unless the daemon counted it locally (holds).
        if answer.holds or not answer.degraded:
            self._admitted[tool_context] = AdmittedCall(
                call_id, guard, send_result=answer.send_result
            )
        return None

    def _ask(self, tool: str, tool_context: Any, reason: str) -> Response:
        """Ask the app's human through ADK's confirmation, when we may and can."""
        if self._confirm and tool_context.function_call_id:
            tool_context.request_confirmation(hint=f"{_question(tool)}{reason}")
            # Pause the run, as ADK's own confirmation gate does: a model shown this
            # response at once would only call the tool again.
            tool_context.actions.skip_summarization = True
        return _refused(vocabulary.needs_approval(reason))

    async def after_tool_callback(
        self,
        *,
        tool: Any,
        tool_args: dict[str, Any],
        tool_context: Any,
        result: dict[str, Any],
    ) -> Response | None:
        # The tool (or its require_confirmation gate) asked for a confirmation: the call
        # will run again once answered, and is checked again then.
        paused = tool_context.function_call_id in tool_context.actions.requested_tool_confirmations
        await self._settle(tool_context, CallStatus.BLOCKED if paused else CallStatus.OK, result)
        return None

    async def on_tool_error_callback(
        self,
        *,
        tool: Any,
        tool_args: dict[str, Any],
        tool_context: Any,
        error: BaseException,
    ) -> Response | None:
        await self._settle(tool_context, CallStatus.ERROR)
        return None

    async def _settle(self, tool_context: Any, status: CallStatus, result: Any = NO_RESULT) -> None:
        admitted = self._admitted.pop(tool_context, None)
        if admitted is None:  # refused, fail-open, or not ours
            return
        await admitted.guard.settle(admitted.call_id, admitted.settlement(status, result))


def _refused(message: str) -> Response:
    """What the model gets in place of the tool's result."""
    return {"error": message}


def _question(tool: str) -> str:
    """How our confirmation hints begin, which tells them from other confirmations."""
    return f"{vocabulary.ASK_REASON.format(tool=tool)}: "


def _our_question(tool_context: Any, tool: str) -> str | None:
    """The daemon's reason, if the confirmation this re-run answers is one we asked for.

    It is read from the session's history, where ADK keeps the request; the re-run's
    `tool_confirmation` holds only the human's answer. Another confirmation (the tool's
    own `require_confirmation`) is the tool's business, and approves nothing of ours.
    """
    wanted = tool_context.function_call_id
    for event in reversed(tool_context.session.events):
        for call in event.get_function_calls():
            args = call.args or {}
            original = args.get("originalFunctionCall") or {}
            if call.name == CONFIRMATION_CALL and original.get("id") == wanted:
                hint = str((args.get("toolConfirmation") or {}).get("hint") or "")
                ours = hint.startswith(_question(tool))
                return hint.removeprefix(_question(tool)) if ours else None
    return None
