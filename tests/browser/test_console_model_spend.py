"""Model spend in the console, in a real browser (Debian chromium through Playwright)
against a real `ratewarden serve` on a real redis-server that settled real model calls
(`kind: model`, priced from their usage) beside tool calls: the user view's "Spent today"
shows each budget's spend with its model calls' part and the rest; the Spend view's
table a column of the model part per day. Names stay text. A viewer reads both, and
both fit 375 px.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import ConsoleMessage, expect

from tests.browser.conftest import (
    CHECK_TOKEN,
    DESKTOP,
    PHONE,
    Console,
    ConsoleDaemon,
    console_serving,
)

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

OpenConsole = Callable[..., Console]
VIEWER_TOKEN = "console-viewer-token-91ce"
# house-* at 2 USD per million input tokens and 8 per million output tokens: 250 000 in
# and 125 000 out cost 0.50 + 1.00 = 1.50 USD.
POLICY = """\
version: 1
defaults: {timezone: UTC}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: all-spend, match: {kind: any}, per: [user], budget: 50.00/day}
  - {name: model-spend, match: {kind: model}, per: [user], budget: 20.00/day}
"""
HOSTILE = "<b>eve</b>"


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """A daemon that settled one model call and one tool call for carol, a tool call only
    for dave, and a model call for a user whose name is markup."""
    directory = tmp_path_factory.mktemp("console-model-spend")
    with console_serving(directory, POLICY, RATEWARDEN_VIEWER_TOKENS=VIEWER_TOKEN) as daemon:
        model_call(daemon, "carol", 250_000, 125_000)
        tool_call(daemon, "carol", 0.75)
        tool_call(daemon, "dave", 0.40)
        model_call(daemon, HOSTILE, 250_000, 0)
        yield daemon


def model_call(daemon: ConsoleDaemon, user: str, input_tokens: int, output_tokens: int) -> None:
    body = {"user": user, "kind": "model", "model": "house-7b",
            "input_tokens": input_tokens, "max_output_tokens": 200_000}  # fmt: skip
    checked = daemon._http("POST", "/v1/check", CHECK_TOKEN, body).json()
    assert checked["allowed"], checked
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    settle = daemon._http(
        "POST", f"/v1/calls/{checked['call_id']}/settle", CHECK_TOKEN, {"usage": usage}
    )
    assert settle.status_code == 200, settle.text


def tool_call(daemon: ConsoleDaemon, user: str, cost: float) -> None:
    body = {"user": user, "tool": "browse", "cost": cost}
    checked = daemon._http("POST", "/v1/check", CHECK_TOKEN, body).json()
    assert checked["allowed"], checked
    settle = daemon._http("POST", f"/v1/calls/{checked['call_id']}/settle", CHECK_TOKEN, {})
    assert settle.status_code == 200, settle.text


def errors_of(console: Console) -> list[str]:
    found: list[str] = []

    def keep(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.append(message.text)

    console.page.on("console", keep)
    return found


def spend_row(console: Console, rule: str, user: str = "carol") -> list[str]:
    """The cells of `rule`'s row of "Spent today", once it shows `user`'s (the answer of
    a user shown before may still be there)."""
    row = console.page.locator(f"#user-spend tbody tr[data-rule='{rule}']")
    expect(row).to_contain_text(f"user={user}")
    return [text.strip() for text in row.locator("td").all_inner_texts()]


def test_the_user_view_shows_todays_model_spend_beside_tool_spend(
    open_console: OpenConsole,
) -> None:
    console = open_console(DESKTOP)
    errors = errors_of(console)
    console.signed_in()
    console.show_user("carol")
    assert spend_row(console, "all-spend") == [
        "all-spend", "user=carol", "2.25 USD", "1.50 USD", "0.75 USD",
    ]  # fmt: skip
    assert spend_row(console, "model-spend") == [
        "model-spend", "user=carol", "1.50 USD", "1.50 USD", "0.00 USD",
    ]  # fmt: skip
    console.show_user("dave")  # tool calls only: no model part
    assert spend_row(console, "all-spend", "dave") == [
        "all-spend", "user=dave", "0.40 USD", "0.00 USD", "0.40 USD",
    ]  # fmt: skip
    expect(console.page.locator("#user-spend tbody tr")).to_have_count(1)
    console.show_user("nobody")
    expect(console.page.locator("#user-spend tbody")).to_have_text("nothing spent today")
    console.show_user(HOSTILE)
    assert spend_row(console, "all-spend", HOSTILE)[1] == f"user={HOSTILE}"  # text, never markup
    assert console.page.locator("#user-spend b").count() == 0
    assert errors == []
    console.screenshot("user-model-spend")


def test_the_spend_view_lists_the_model_part_of_each_day(open_console: OpenConsole) -> None:
    console = open_console(DESKTOP)
    console.signed_in()
    console.open_view("spend")
    page = console.page
    page.fill("#spend-user", "carol")
    page.click("#spend-form button[type=submit]")
    expect(page.locator("#spend-table thead")).to_contain_text("Of it, models")
    rows = page.locator("#spend-table tbody tr")
    expect(rows).to_have_count(2)
    cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in (0, 1)]
    assert sorted(row[1:] for row in cells) == [
        ["all-spend", "user=carol", "2.25 USD", "1.50 USD"],
        ["model-spend", "user=carol", "1.50 USD", "1.50 USD"],
    ]
    console.screenshot("spend-model-part")


def test_a_viewer_reads_model_spend_on_a_phone(open_console: OpenConsole) -> None:
    console = open_console(PHONE)
    errors = errors_of(console)
    console.sign_in(VIEWER_TOKEN)
    expect(console.page.locator("#role")).to_have_text("viewer: read only")
    console.show_user("carol")
    expect(console.page.locator("#user-spend tbody tr[data-rule='all-spend']")).to_contain_text(
        "1.50 USD"
    )
    width = console.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the user view is {width} px wide"
    assert errors == []
    console.screenshot("phone-user-model-spend")
