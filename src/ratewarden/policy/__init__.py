"""The policy: its file format, validation, and the compiled form the engine reads."""

from ratewarden.policy.errors import PolicyError, PolicyIssue
from ratewarden.policy.loader import load_example_policy, load_policy, parse_policy
from ratewarden.policy.model import Algorithm, Applied, Mode, OnExceed, Policy, RateLimit, Rule

__all__ = [
    "Algorithm",
    "Applied",
    "Mode",
    "OnExceed",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "RateLimit",
    "Rule",
    "load_example_policy",
    "load_policy",
    "parse_policy",
]
