"""What `policy check` warns of in the `notifications:` section: a variable it names that
is not set where the check runs, and a webhook whose posts nobody could verify.

Warnings, not errors: the daemon may run with another environment than the check (a
CI job has no secrets), and it says so again at start if a variable is missing there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ratewarden.policy.errors import PolicyIssue
from ratewarden.policy.schema import PolicySpec

Path_ = tuple[str | int, ...]


def notification_warnings(
    spec: PolicySpec,
    line_of: Callable[[Path_], int | None],
    environ: Mapping[str, str] = os.environ,
) -> list[PolicyIssue]:
    found: list[PolicyIssue] = []
    hooks = spec.notifications.webhooks if spec.notifications else []
    for i, hook in enumerate(hooks):
        for name in ("url_env", "secret_env"):
            variable = getattr(hook, name)
            if variable is not None and not environ.get(variable):
                path: Path_ = ("notifications", "webhooks", i, name)
                what = "URL" if name == "url_env" else "signing secret"
                message = (
                    f"notifications.webhooks[{i}].{name}: ${variable} is not set here: the "
                    f"daemon needs it set (the webhook's {what})"
                )
                found.append(PolicyIssue(path, message, line_of(path)))
        if hook.secret_env is None:
            path = ("notifications", "webhooks", i)
            message = (
                f"notifications.webhooks[{i}] has no secret_env: its posts are not signed, "
                "so its receiver cannot tell them from anyone's"
            )
            found.append(PolicyIssue(path, message, line_of(path)))
    return found
