"""ratewarden as a hermes-agent directory plugin: the same hooks as the entry point.

hermes imports this file from `$HERMES_HOME/plugins/ratewarden/` and calls `register`;
everything else lives in `ratewarden.integrations.hermes`, which must be importable from
hermes' environment. To choose the user or the fail mode in code, replace the body:

    from ratewarden.integrations.hermes import RatewardenPlugin
    RatewardenPlugin(fail="closed", user=lambda hook: ...).register(ctx)
"""

from __future__ import annotations

from typing import Any


def register(ctx: Any) -> None:
    from ratewarden.integrations.hermes import register as register_ratewarden

    register_ratewarden(ctx)
