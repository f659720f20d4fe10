"""The decision engine: rules to counter ops, one atomic store call, a worded decision."""

from ratewarden.engine.engine import Decision, Engine, Usage, Verdict

__all__ = ["Decision", "Engine", "Usage", "Verdict"]
