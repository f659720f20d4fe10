"""The console's Spend view in a real browser (Debian chromium through Playwright) against
a real `ratewarden serve` on a real redis-server: what each budget rule charged per UTC
day, drawn by uPlot (packaged, under the console's CSP: the canvas must really hold
bars), listed in a table and totalled, filtered by user and team, downloaded as CSV with
formula-like names neutralised; a viewer reads it; it fits 375 px. Screenshots at 1280
and 375 px, as the other console tests save them.
"""

from __future__ import annotations

import csv
import io
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
    save_for_docs,
)

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

OpenConsole = Callable[..., Console]
VIEWER_TOKEN = "console-viewer-token-5d21"
POLICY = """\
version: 1
defaults: {timezone: UTC}
rules:
  - {name: daily-spend, per: [user], budget: 50.00/day, currency: USD}
  - {name: team-spend, per: [team], budget: 500.00/day, currency: EUR}
"""
FORMULA = '=HYPERLINK("http://evil.example","click")'


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """A daemon with two budgets, a viewer token, and some money spent."""
    directory = tmp_path_factory.mktemp("console-spend")
    with console_serving(directory, POLICY, RATEWARDEN_VIEWER_TOKENS=VIEWER_TOKEN) as daemon:
        for user, team, cost in [
            ("alice", "red", 1.25),
            ("alice", "red", 0.50),
            ("bob", "red", 2.00),
            (FORMULA, "blue", 0.10),
            ("ユーザー <b>x</b>", "blue", 0.05),
        ]:
            spend(daemon, user, team, cost)
        yield daemon


def spend(daemon: ConsoleDaemon, user: str, team: str, cost: float) -> None:
    body = {"user": user, "team": team, "tool": "t", "cost": cost}
    checked = daemon._http("POST", "/v1/check", CHECK_TOKEN, body).json()
    assert checked["allowed"], checked
    settled = daemon._http("POST", f"/v1/calls/{checked['call_id']}/settle", CHECK_TOKEN, {})
    assert settled.status_code == 200, settled.text


def errors_of(console: Console) -> list[str]:
    """The page's console errors (a CSP refusal of a script or style would be one)."""
    found: list[str] = []

    def keep(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.append(message.text)

    console.page.on("console", keep)
    return found


def bars_drawn(console: Console) -> int:
    """Coloured pixels on uPlot's canvas: more than the axes' grey means bars."""
    return int(
        console.page.evaluate(
            """() => {
              const canvas = document.querySelector('#spend-chart canvas');
              if (!canvas) return 0;
              const data = canvas.getContext('2d')
                .getImageData(0, 0, canvas.width, canvas.height).data;
              let coloured = 0;
              for (let i = 0; i < data.length; i += 4) {
                const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
                if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured++;
              }
              return coloured;
            }"""
        )
    )


def open_spend(console: Console) -> None:
    console.open_view("spend")
    expect(console.page.locator("#spend-table tbody tr").first).to_be_visible()
    console.page.wait_for_load_state("networkidle")


def test_the_spend_view_draws_lists_and_totals(open_console: OpenConsole) -> None:
    console = open_console(DESKTOP)
    errors = errors_of(console)
    console.signed_in()
    open_spend(console)
    page = console.page
    expect(page.locator("#spend-totals")).to_have_text("Total: 3.90 EUR; 3.90 USD")
    rows = page.locator("#spend-table tbody tr")
    expect(rows).to_have_count(6)  # alice, bob, the formula, the unicode name; red, blue
    expect(page.locator("#spend-table")).to_contain_text("user=alice")
    expect(page.locator("#spend-table")).to_contain_text("1.75 USD")
    # Names are text, never markup or a formula run anywhere.
    expect(page.locator("#spend-table")).to_contain_text(f"user={FORMULA}")
    expect(page.locator("#spend-table")).to_contain_text("user=ユーザー <b>x</b>")
    assert page.locator("#spend-table b").count() == 0
    # uPlot drew under the CSP: a canvas with bars in it, a legend per currency.
    assert page.locator("#spend-chart .uplot canvas").count() == 1
    assert bars_drawn(console) > 200
    expect(page.locator("#spend-chart .u-legend")).to_contain_text("USD")
    expect(page.locator("#spend-chart .u-legend")).to_contain_text("EUR")
    assert errors == []
    save_for_docs(console.screenshot("spend-desktop"), "console-spend.png")


def test_filters_narrow_to_a_user_or_a_team(open_console: OpenConsole) -> None:
    console = open_console(DESKTOP)
    console.signed_in()
    open_spend(console)
    page = console.page
    page.fill("#spend-user", "alice")
    page.click("#spend-form button[type=submit]")
    expect(page.locator("#spend-totals")).to_have_text("Total: 1.75 USD")
    expect(page.locator("#spend-table tbody tr")).to_have_count(1)
    page.fill("#spend-user", "")
    page.fill("#spend-team", "blue")
    page.click("#spend-form button[type=submit]")
    expect(page.locator("#spend-totals")).to_have_text("Total: 0.15 EUR")
    page.select_option("#spend-since", "90d")
    expect(page.locator("#spend-range")).to_contain_text("kept 90 days")
    page.fill("#spend-team", "nobody")
    page.click("#spend-form button[type=submit]")
    expect(page.locator("#spend-totals")).to_have_text("Nothing spent in these days.")
    assert bars_drawn(console) == 0  # an empty chart: axes only
    console.screenshot("spend-filtered-empty")


def test_the_csv_download_neutralises_formulas(open_console: OpenConsole) -> None:
    console = open_console(DESKTOP)
    console.signed_in()
    open_spend(console)
    with console.page.expect_download() as downloading:
        console.page.click("#spend-csv")
    download = downloading.value
    assert download.suggested_filename.startswith("ratewarden-spend-")
    assert download.suggested_filename.endswith(".csv")
    path = download.path()
    assert path is not None
    table = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert table[0] == ["day", "rule", "user", "team", "scope", "amount", "currency", "model"]
    users = {row[2] for row in table[1:] if row[1] == "daily-spend"}
    assert users == {"alice", "bob", "'" + FORMULA, "ユーザー <b>x</b>"}


def test_a_viewer_reads_it_on_a_phone(open_console: OpenConsole) -> None:
    console = open_console(PHONE)
    errors = errors_of(console)
    console.sign_in(VIEWER_TOKEN)
    expect(console.page.locator("#role")).to_have_text("viewer: read only")
    open_spend(console)
    expect(console.page.locator("#spend-totals")).to_have_text("Total: 3.90 EUR; 3.90 USD")
    assert bars_drawn(console) > 100
    width = console.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the spend view is {width} px wide"
    chart = console.page.evaluate("document.querySelector('#spend-chart canvas').clientWidth")
    assert chart <= PHONE["width"]
    assert errors == []
    console.screenshot("phone-spend")
