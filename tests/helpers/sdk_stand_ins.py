"""Stand-ins for the few classes of a host SDK an adapter imports at call time, for unit
tests that drive an adapter without installing its host (the real hosts run under
tests/hosts): the OpenAI Agents SDK's guardrail types and pydantic-ai-middleware's
permission types, and `stand_in`, which puts them where the adapter imports from."""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest


def stand_in(monkeypatch: pytest.MonkeyPatch, module: str, **attributes: Any) -> None:
    """A module `module` holding `attributes`, importable for the rest of the test."""
    fake = types.ModuleType(module)
    for name, value in attributes.items():
        setattr(fake, name, value)
    monkeypatch.setitem(sys.modules, module, fake)


class ToolDecision(enum.Enum):  # pydantic-ai-middleware's
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass
class ToolPermissionResult:  # pydantic-ai-middleware's
    decision: ToolDecision
    reason: str = ""


class ToolGuardrailFunctionOutput:  # the OpenAI Agents SDK's
    def __init__(self, allowed: bool, message: str = "") -> None:
        self.allowed, self.message = allowed, message

    @classmethod
    def allow(cls, output_info: Any = None) -> ToolGuardrailFunctionOutput:
        return cls(True)

    @classmethod
    def reject_content(cls, message: str, output_info: Any = None) -> ToolGuardrailFunctionOutput:
        return cls(False, message)


@dataclass
class ToolGuardrail:  # its ToolInputGuardrail and ToolOutputGuardrail
    guardrail_function: Any
    name: str


@dataclass(eq=False)
class ToolContext:  # its ToolContext (a weak-referenceable dataclass)
    tool_name: str
    tool_call_id: str
    context: Any
    tool_arguments: str = "{}"
