"""One MCP session's tool-call guard: annotations to metadata, check, ask, settle.

Transport-free: it reads the plain JSON of `initialize`, `tools/list` and `tools/call`
(the `params` and `result` objects) and answers with what to do, so the stdio proxy and a
gateway (one `SessionGuard` per client session) share it.

- **Annotations.** Each `tools/list` result read (the client's, and the proxy's own
  re-listing after `notifications/tools/list_changed`) maps a tool's `readOnlyHint`,
  `destructiveHint`, `idempotentHint` and `openWorldHint` to the check's metadata. Only
  the hints the server gave are sent: a tool without annotations is unclassified (no
  metadata), which the daemon never treats as safe.
- **Check.** `tools/call` is checked as the session's user, the call id led by the
  JSON-RPC id with a random suffix (`mcp-7~<16 hex>`: clients restart their ids at 0);
  the `arguments` go along only while the policy reads them (the client's ArgsGate).
- **Ask.** With the client's form elicitation capability declared in `initialize`, the
  user is asked by the relay's `ask`; an accepted ask is checked again with
  `approved: true`. Otherwise the call is refused with `vocabulary.needs_approval`. A
  client on the 2026-07-28 protocol (no `initialize` the server accepted; Claude Code 2.x)
  is never asked: it drops a server's `elicitation/create` sent outside a request ("not
  servable on this connection's protocol era"), and the call would wait for ever.
- **Settle.** An admitted call that holds a concurrency slot or budget money is settled
  when the server answers (`ok`, or `error` for `isError` or a JSON-RPC error), when it
  is cancelled (`cancelled`), or when the session ends first (`abandoned`), with the time
  the server took. The answer goes to the client first; the session's next check waits
  for the settle. A call that holds nothing is not settled (the daemon keeps nothing of
  it to free), as with every adapter. A call the daemon answered with `send_result` (a
  loop rule keyed on results) is settled with the digest of the server's
  `CallToolResult`: its `content`, `structuredContent` and `isError`, not a `_meta`
  (`_lifecycle.call_tool_result`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ratewarden import vocabulary
from ratewarden.client import ClientError, unreachable_answer
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall, call_tool_result
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest, ToolMetadata
from ratewarden.wire.names import check_request

__all__ = ["GuardAction", "SessionGuard", "ToolCatalog", "can_elicit", "tool_metadata"]

HOST = "mcp"  # leads a call id when the JSON-RPC id cannot
log = logging.getLogger("ratewarden.mcp")

Ask = Callable[[str, str], Awaitable[bool]]  # (tool, message) -> the user approved
Settle = Callable[[], Awaitable[None]]
RequestId = int | str


def tool_metadata(tool: Mapping[str, Any]) -> ToolMetadata | None:
    """The check's metadata for one `Tool` of a `tools/list` result: the hints it has."""
    annotations = tool.get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    hints = vocabulary.hint_flags(annotations)
    return ToolMetadata.model_validate(hints) if hints else None


def can_elicit(capabilities: object) -> bool:
    """Whether these client capabilities include form elicitation (`{}` means form)."""
    if not isinstance(capabilities, Mapping):
        return False
    elicitation = capabilities.get("elicitation")
    if not isinstance(elicitation, Mapping):
        return False
    return not elicitation or elicitation.get("form") is not None


class ToolCatalog:
    """The metadata of each tool the server listed, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolMetadata | None] = {}

    def read(self, result: Mapping[str, Any]) -> None:
        """Take in one page of a `tools/list` result (a later listing wins)."""
        self._tools.update(self._page(result))

    def replace(self, pages: Iterable[Mapping[str, Any]]) -> None:
        """A full listing: tools no longer listed are forgotten."""
        tools: dict[str, ToolMetadata | None] = {}
        for page in pages:
            tools.update(self._page(page))
        self._tools = tools

    def metadata(self, tool: str) -> ToolMetadata | None:
        return self._tools.get(tool)

    @staticmethod
    def _page(result: Mapping[str, Any]) -> dict[str, ToolMetadata | None]:
        listed = result.get("tools")
        tools = listed if isinstance(listed, list) else []
        return {
            tool["name"]: tool_metadata(tool)
            for tool in tools
            if isinstance(tool, Mapping) and isinstance(tool.get("name"), str)
        }


class GuardAction(enum.Enum):
    FORWARD = "forward"  # send the call on to the server
    REFUSE = "refuse"  # answer it with an error result (`Verdict.message`)
    DROP = "drop"  # cancelled meanwhile: no answer is due


@dataclass(frozen=True)
class Verdict:
    decision: GuardAction
    message: str = ""


class Daemon(Protocol):
    """What a session asks: an `AsyncGuard`, or the gateway's pool of daemons."""

    fail: vocabulary.FailMode

    async def check(self, request: CheckRequest) -> CheckResponse: ...

    async def settle(self, call_id: str, request: SettleRequest | None = None) -> object: ...


class SessionGuard:
    """The guard of one client session; `user` (and `team`, `session`) name its caller.
    `server`, when set, names the server's tools to the daemon as `server.tool` (the
    gateway fronts several servers; the client still sees the tools' own names)."""

    def __init__(
        self,
        guard: Daemon,
        *,
        user: str,
        team: str | None = None,
        session: str | None = None,
        server: str | None = None,
    ) -> None:
        self.guard = guard
        self.user, self.team, self.session = user, team, session
        self._prefix = f"{server}." if server else ""
        self.catalog = ToolCatalog()
        self.elicits = False
        self._admitted: dict[RequestId, AdmittedCall] = {}
        self._checking: dict[RequestId, str] = {}  # request id -> call id, being checked
        self._cancelled: set[RequestId] = set()
        self._settling: list[asyncio.Event] = []  # settles under way, in the order begun

    def initialize(self, params: Mapping[str, Any] | None) -> None:
        """The client's `initialize` request: remember whether it can be asked."""
        self.elicits = can_elicit((params or {}).get("capabilities"))

    async def check(self, request_id: RequestId, params: Mapping[str, Any], ask: Ask) -> Verdict:
        """What to do with `tools/call` `request_id`; an admitted call awaits `sent`."""
        tool = params.get("name")
        if not isinstance(tool, str) or not tool:
            return Verdict(GuardAction.FORWARD)  # not a call the server can run: its error
        call_id = vocabulary.call_id(HOST, str(request_id))
        self._checking[request_id] = call_id
        while self._settling:  # the calls that just ended first give back what they held
            await self._settling[0].wait()
        # Cancelled with its session (the client gone mid-check, or mid-ask), the call stays
        # in `_checking` for `close` to settle: the daemon may have granted it already.
        answer = await self._decide(tool, call_id, params, ask)
        del self._checking[request_id]
        # Only a call holding a slot or money is settled (as every adapter does): the daemon
        # keeps nothing else of it, and a settle costs the next call time on this machine.
        held = answer.holds
        if request_id in self._cancelled:
            self._cancelled.discard(request_id)
            if held:
                await self._settle(_unstarted(call_id), CallStatus.CANCELLED)
            return Verdict(GuardAction.DROP)
        if not answer.allowed:
            return Verdict(GuardAction.REFUSE, answer.message)
        if held:
            self._admitted[request_id] = _unstarted(call_id, answer.send_result)
        return Verdict(GuardAction.FORWARD)

    async def _decide(
        self, tool: str, call_id: str, params: Mapping[str, Any], ask: Ask
    ) -> CheckResponse:
        args = params.get("arguments")
        answer = await self._check(tool, call_id, args, approved=False)
        if answer.decision == "ask":
            answer = await self._asked(tool, call_id, args, answer, ask)
        return answer

    async def _asked(
        self,
        tool: str,
        call_id: str,
        args: object,
        answer: CheckResponse,
        ask: Ask,
    ) -> CheckResponse:
        """An `ask`: the user's approval, checked again; else a refusal saying so."""
        if not self.elicits:
            return answer.model_copy(
                update={"message": vocabulary.needs_approval(answer.message), "allowed": False}
            )
        if not await ask(tool, answer.message):
            declined = f"{answer.message.rstrip('. ')}. The user did not approve this call."
            return answer.model_copy(update={"message": declined, "allowed": False})
        return await self._check(tool, call_id, args, approved=True)

    async def _check(
        self, tool: str, call_id: str, args: object, *, approved: bool
    ) -> CheckResponse:
        try:
            request = check_request(
                user=self.user,
                tool=self._prefix + tool,
                team=self.team,
                session=self.session,
                call_id=call_id,
                metadata=self.catalog.metadata(tool),
                approved=approved,
                args=args,
            )
            return await self.guard.check(request)
        except (ClientError, ValueError) as exc:  # bad input or auth: the fail mode answers
            unsent = CheckRequest.model_construct(
                user=self.user, tool=self._prefix + tool, call_id=call_id
            )
            return unreachable_answer(unsent, self.guard.fail, exc)

    def sent(self, request_id: RequestId) -> None:
        """The admitted call went to the server: its duration starts now."""
        admitted = self._admitted.get(request_id)
        if admitted is not None:
            admitted.start()

    def waiting(self, request_id: RequestId) -> bool:
        """Whether `request_id` is an admitted call the server has yet to answer."""
        return request_id in self._admitted

    def finish(
        self, request_id: RequestId, *, error: bool, result: Any = NO_RESULT
    ) -> Settle | None:
        """The server answered call `request_id` (an error result, or a success; `result`:
        its `CallToolResult`, none for a JSON-RPC error): its settle, for the relay to run
        once the answer is on its way to the client (None: nothing to settle). Until it has
        run, this session's next checks wait for it, so a call made as soon as the last one
        answered finds its slot or money free."""
        admitted = self._admitted.pop(request_id, None)
        if admitted is None:
            return None
        status = CallStatus.ERROR if error else CallStatus.OK
        if admitted.send_result and result is not NO_RESULT:  # digested only when asked for
            result = call_tool_result(result)
        # the server's time, not the relay's after it
        request = admitted.settlement(status, result)
        done = asyncio.Event()
        self._settling.append(done)

        async def settle() -> None:
            try:
                await self.guard.settle(admitted.call_id, request)
            finally:
                self._settling.remove(done)
                done.set()

        return settle

    async def cancel(self, request_id: RequestId) -> None:
        """`notifications/cancelled` for `request_id`: settle it, or drop it once checked."""
        if request_id in self._checking:
            self._cancelled.add(request_id)
            return
        admitted = self._admitted.pop(request_id, None)
        if admitted is not None:
            await self._settle(admitted, CallStatus.CANCELLED)

    async def close(self) -> None:
        """The session ended: every call still out is settled as abandoned (and each one
        whose check it cut short: settling a call the daemon did not grant is a no-op)."""
        admitted = [*self._admitted.values(), *map(_unstarted, self._checking.values())]
        self._admitted, self._checking = {}, {}
        for call in admitted:
            await self._settle(call, CallStatus.ABANDONED)

    async def _settle(self, call: AdmittedCall, status: CallStatus) -> None:
        await self.guard.settle(call.call_id, call.settlement(status))


def _unstarted(call_id: str, send_result: bool = False) -> AdmittedCall:
    """An admitted call not yet sent to the server: its duration starts at `sent`."""
    return AdmittedCall(call_id, send_result=send_result, started=False)


def refusal_result(message: str) -> dict[str, Any]:
    """The `CallToolResult` a refused call is answered with: the model reads `message`."""
    return {"content": [{"type": "text", "text": message}], "isError": True}
