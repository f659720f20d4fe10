"""What `GET /v1/admin/spend` answers: the wire's rows with `model`, the part of each
amount model calls' settles charged (docs/operations.md, "Spend history").

Here, not in wire/bodies.py, while that module is another change's: fold `model` into
SpendRow there and these two go. Read by the daemon (service/spend.py) and the client.
"""

from __future__ import annotations

from pydantic import Field

from ratewarden.wire.bodies import SpendResponse, SpendRow


class ModelSpendRow(SpendRow):
    """A spend row with the part of its amount that model calls charged."""

    model: float = Field(
        0.0, description="the part of amount that model calls' settles charged (the rest: "
        "tool calls, and reservations charged at their estimate when they expired)"
    )  # fmt: skip


class ModelSpendResponse(SpendResponse):
    rows: list[ModelSpendRow] = Field(  # type: ignore[assignment]
        description="per day, rule and scope, oldest day first"
    )
