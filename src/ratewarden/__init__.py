"""ratewarden: rate limits, concurrency caps and cost budgets for AI-agent tool calls.

The public surface is small: run the daemon with `ratewarden serve`, talk to it with
`ratewarden.client`, and build an app in-process with `ratewarden.service.create_app`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
