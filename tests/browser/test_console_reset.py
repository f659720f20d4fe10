"""The console's reset asks first (issue 26, item 6), in a real browser against a real
`ratewarden serve` on a real redis-server: the first click names the amount that would be
forgotten, as the daemon reads it at that moment; only a second click resets; Cancel
keeps everything.

The module runs its own daemon, on the console tests' policy plus a budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import (
    POLICY,
    Console,
    ConsoleDaemon,
    console_serving,
)

BUDGET = "daily-spend"
BUDGET_POLICY = f"""{POLICY}\
  - name: {BUDGET}
    match: {{tool: browser}}
    per: [user]
    budget: 10/day
    currency: USD
"""
OpenConsole = Callable[..., Console]


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """As conftest's, on BUDGET_POLICY (this module's open_console uses it)."""
    with console_serving(tmp_path_factory.mktemp("console-reset"), BUDGET_POLICY) as daemon:
        yield daemon


def spend(daemon: ConsoleDaemon, user: str, call_id: str, cost: float, settled: float) -> None:
    """A browser call reserving `cost`, settled at `settled`."""
    body = {"user": user, "tool": "browser", "cost": cost, "call_id": call_id}
    assert daemon.admin("POST", "/v1/check", body).json()["allowed"]
    done = daemon.admin("POST", f"/v1/calls/{call_id}/settle", {"cost": settled})
    assert done.status_code == 200, done.text


def reserve(daemon: ConsoleDaemon, user: str, call_id: str, cost: float) -> None:
    body = {"user": user, "tool": "browser", "cost": cost, "call_id": call_id}
    assert daemon.admin("POST", "/v1/check", body).json()["allowed"]


def held(daemon: ConsoleDaemon, user: str) -> tuple[float, float]:
    """The budget's (spent, reserved) for `user`, as the daemon reports them."""
    limits = daemon.admin("GET", f"/v1/usage?user={user}").json()["limits"]
    [item] = [item for item in limits if item["rule"] == BUDGET]
    return item["used"], item["reserved"]


def test_a_budget_reset_asks_first_naming_the_amount_read_now(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    user = "alice-budget"
    spend(console_daemon, user, "ab-1", 2.0, 2.2)
    console = open_console()
    console.signed_in()
    console.show_user(user)
    page = console.page
    row = page.locator(f"#usage-table tbody tr[data-rule='{BUDGET}']")
    expect(row).to_contain_text("2.20")
    spend(console_daemon, user, "ab-2", 1.0, 1.0)  # after the table was read
    reserve(console_daemon, user, "ab-3", 0.5)

    page.click(f"button[aria-label='Reset {BUDGET}']")
    question = f"Forget 3.20 USD spent (+0.50 reserved) by {user} on {BUDGET}?"
    expect(row).to_contain_text(question)  # the amount as it is now, not as shown before
    assert held(console_daemon, user) == (3.2, 0.5)  # a question, not a reset
    console.screenshot("user-reset-question")

    page.click(f"button[aria-label='Cancel reset {BUDGET}']")
    expect(row.locator(f"button[aria-label='Reset {BUDGET}']")).to_be_visible()
    expect(row).not_to_contain_text("Forget")
    assert held(console_daemon, user) == (3.2, 0.5)

    page.click(f"button[aria-label='Reset {BUDGET}']")
    page.click(f"button[aria-label='Confirm reset {BUDGET}']")
    message = page.locator("#user-message")
    expect(message).to_contain_text(f"forgot 3.20 USD spent (+0.50 reserved) on {BUDGET}")
    assert held(console_daemon, user) == (0.0, 0.0)
    expect(row.locator("td").nth(3)).to_have_text("0.00")  # the table read again


def test_a_rate_reset_asks_first_too(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    user = "bob-rate"
    assert [console_daemon.check(user) for _ in range(2)] == ["allow", "allow"]
    console = open_console()
    console.signed_in()
    console.show_user(user)
    page = console.page
    page.click("button[aria-label='Reset terminal-per-minute']")
    row = page.locator("#usage-table tbody tr[data-rule='terminal-per-minute']")
    expect(row).to_contain_text(f"Forget 2 calls by {user} on terminal-per-minute?")
    page.keyboard.press("Enter")  # the focus is on Cancel: Enter forgets nothing
    expect(row.locator("button[aria-label='Reset terminal-per-minute']")).to_be_visible()
    assert console_daemon.check(user) == "deny"
