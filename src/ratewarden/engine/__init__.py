"""The decision engine: rules to counter ops, one atomic store call, a worded decision."""

from ratewarden.engine.decision import Decision, Settlement, Usage, Verdict
from ratewarden.engine.engine import CallIdConflict, Engine, NotAModelCall

__all__ = [
    "CallIdConflict",
    "Decision",
    "Engine",
    "NotAModelCall",
    "Settlement",
    "Usage",
    "Verdict",
]
