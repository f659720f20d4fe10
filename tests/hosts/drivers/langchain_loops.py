"""A real LangChain v1 agent polls `ci_status` through RatewardenMiddleware, offline.

Runs in the langchain host venv; argv[1] is a JSON config (`url`, `work`, `user`,
`polls`). A scripted `GenericFakeChatModel` asks for the same call `polls` times, one per
turn; the tool answers from drivers/ci_status.py (changing every second call, then the
same). The report (one JSON line) holds the tool results the model read and which of
them were errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from ratewarden.client import Guard
from ratewarden.integrations.langchain import RatewardenMiddleware

sys.path.insert(0, str(Path(__file__).parent))
from ci_status import next_answer  # type: ignore[import-not-found,unused-ignore]

CONFIG: dict[str, Any] = json.loads(sys.argv[1])
COUNTER = Path(CONFIG["work"]) / "langchain.count"


@tool
def ci_status(run: str) -> str:
    """The state of a CI run."""
    return str(next_answer(COUNTER))


class Poller(GenericFakeChatModel):
    """Asks for `ci_status(run="42")` once a turn, `polls` times, then answers."""

    polls: int
    disable_streaming: bool = True

    def bind_tools(self, tools: Any, **kwargs: Any) -> Poller:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if turn >= self.polls:
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])
        call = {
            "name": "ci_status",
            "args": {"run": "42"},
            "id": f"poll_{turn}",
            "type": "tool_call",
        }
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[call]))]
        )


def main() -> dict[str, Any]:
    agent = create_agent(
        Poller(messages=iter(()), polls=CONFIG["polls"]),
        tools=[ci_status],
        middleware=[RatewardenMiddleware(Guard(CONFIG["url"]))],
    )
    state = agent.invoke(
        {"messages": [{"role": "user", "content": "watch CI run 42"}]},
        context={"user_id": CONFIG["user"]},
    )
    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"results": [{"text": str(m.content), "is_error": m.status == "error"} for m in answers]}


if __name__ == "__main__":
    print(json.dumps(main()))
