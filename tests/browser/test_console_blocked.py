"""Who is blocked, in a real browser (Debian's chromium through Playwright), against two
real `ratewarden serve` on one real redis-server: the overview lists the users refused
most through either daemon with their top rule and tool, each linking to the user view;
the per-rule and per-user charts are drawn by uPlot (shipped in the package) under the
page's CSP; at 1280 and 375 px, with screenshots as the other console tests save them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from tests.browser.conftest import (
    ADMIN_TOKEN,
    CHECK_TOKEN,
    DESKTOP,
    PHONE,
    POLICY,
    Console,
    ConsoleDaemon,
    save_for_docs,
)
from tests.helpers.daemon import clean_environment, running_daemon
from tests.helpers.redis_server import running_redis

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

OpenConsole = Callable[..., Console]
FLUSHED_MS = 20_000  # a flush and an overview refresh (every 5 s each), with room
# The refusal colour of both charts (#b42318), as drawn on the canvas: anti-aliasing aside.
REFUSAL_PIXELS = """(id) => {
  const canvas = document.querySelector(`#${id} canvas`);
  if (!canvas || !canvas.width) return -1;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let found = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i] > 150 && data[i + 1] < 90 && data[i + 2] < 90 && data[i + 3] > 200) found++;
  }
  return found;
}"""
HOSTILE_USER = "eve/<img src=x onerror=alert(1)>#%2F?"


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ConsoleDaemon, ConsoleDaemon]]:
    """Two daemons on one Redis, both on the console's POLICY; the console opens the first."""
    directory = tmp_path_factory.mktemp("fleet")
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(RATEWARDEN_ADMIN_TOKENS=ADMIN_TOKEN, RATEWARDEN_API_TOKENS=CHECK_TOKEN)
    with contextlib.ExitStack() as stack:
        redis_server = stack.enter_context(running_redis(directory / "redis"))
        flags = ("--store-url", redis_server.url, "--policy", str(policy))
        daemons = []
        for name in ("a", "b"):
            (directory / name).mkdir()
            daemon = stack.enter_context(running_daemon(directory / name, *flags, env=env))
            daemons.append(ConsoleDaemon(daemon, policy))
        yield daemons[0], daemons[1]


@pytest.fixture(scope="module")
def console_daemon(fleet: tuple[ConsoleDaemon, ConsoleDaemon]) -> ConsoleDaemon:
    """What `open_console` opens: the first daemon of the fleet."""
    return fleet[0]


@pytest.fixture(scope="module")
def refused(fleet: tuple[ConsoleDaemon, ConsoleDaemon]) -> dict[str, int]:
    """Refusals through both daemons: through the first, through the second, and both."""
    first, second = fleet
    counts = {"bob-blocked": 6, "ann-blocked": 3}
    for _ in range(3):
        assert second.check("bob-blocked", "evil-rm") == "deny"
        assert first.check("bob-blocked", "evil-rm") == "deny"
    for daemon in (first, second, first, second, first):  # 2 allowed, then 3 refused
        daemon.check("ann-blocked")
    return counts


def csp_violations(page: Page) -> list[str]:
    """What the page's console says about the Content-Security-Policy, from now on."""
    found: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            found.append(message.text)

    page.on("console", heard)
    return found


def charted(page: Page, chart: str) -> None:
    """`chart` is a uPlot canvas with the refusals' colour drawn on it."""
    expect(page.locator(f"#{chart} canvas")).to_have_count(1)
    page.wait_for_function(f"({REFUSAL_PIXELS})('{chart}') > 20", timeout=FLUSHED_MS)


def blocked_rows(page: Page) -> list[str]:
    return [
        row.get_attribute("data-user") or ""
        for row in page.locator("#blocked-users tbody tr").all()
    ]


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "375"])
def test_the_overview_says_who_is_blocked_across_the_fleet(
    open_console: OpenConsole, refused: dict[str, int], viewport: dict[str, int]
) -> None:
    console = open_console(viewport)
    violations = csp_violations(console.page)
    console.signed_in()  # the overview is the first view
    page = console.page
    bob = page.locator("#blocked-users tbody tr[data-user='bob-blocked']")
    expect(bob).to_contain_text("6", timeout=FLUSHED_MS)  # 3 through each daemon
    expect(bob).to_contain_text("no-evil-tools (6)")
    expect(bob).to_contain_text("evil-rm (6)")
    ann = page.locator("#blocked-users tbody tr[data-user='ann-blocked']")
    expect(ann).to_contain_text("terminal-per-minute (3)", timeout=FLUSHED_MS)
    assert blocked_rows(page)[:2] == ["bob-blocked", "ann-blocked"]  # most refused first
    charted(page, "rules-chart")
    expect(page.locator("#rules-chart .u-legend")).to_contain_text("no-evil-tools")
    page.click("#blocked-window button[data-value='1d']")
    expect(page.locator("#blocked-window button[data-value='1d']")).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(page.locator("#blocked-note")).to_contain_text("over the last day")
    expect(bob).to_contain_text("6")
    page.click("#rules-resolution button[data-value='hour']")
    expect(page.locator("#rules-chart-note")).to_contain_text("per hour over the last day")
    charted(page, "rules-chart")
    page.wait_for_load_state("networkidle")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"the overview is {width} px wide"
    shot = console.screenshot(f"blocked-overview-{viewport['width']}")
    if viewport == DESKTOP:
        save_for_docs(shot, "console-blocked.png")
    assert violations == []


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "375"])
def test_a_blocked_user_links_to_their_view_with_a_chart(
    open_console: OpenConsole, refused: dict[str, int], viewport: dict[str, int]
) -> None:
    console = open_console(viewport)
    violations = csp_violations(console.page)
    console.signed_in()
    page = console.page
    link = page.locator("#blocked-users tbody tr[data-user='bob-blocked'] a")
    expect(link).to_be_visible(timeout=FLUSHED_MS)
    link.click()
    expect(page.locator("#view-user")).to_be_visible()
    expect(page.locator("#user-title")).to_have_text("bob-blocked")
    expect(page.locator("#user-denials tbody tr", has_text="evil-rm")).to_have_count(6)
    charted(page, "user-chart")
    expect(page.locator("#user-chart-note")).to_contain_text("6 decisions, 6 refusals")
    page.click("#user-resolution button[data-value='hour']")
    expect(page.locator("#user-chart-note")).to_contain_text("per hour over the last day")
    charted(page, "user-chart")
    page.wait_for_load_state("networkidle")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"the user view is {width} px wide"
    console.screenshot(f"blocked-user-{viewport['width']}")
    assert violations == []


def test_a_hostile_name_links_to_its_own_user(
    open_console: OpenConsole, fleet: tuple[ConsoleDaemon, ConsoleDaemon]
) -> None:
    assert fleet[1].check(HOSTILE_USER, "evil-x") == "deny"
    console = open_console()
    console.signed_in()
    page = console.page
    link = page.locator("#blocked-users tbody a", has_text=HOSTILE_USER)
    expect(link).to_be_visible(timeout=FLUSHED_MS)
    link.click()
    expect(page.locator("#user-title")).to_have_text(HOSTILE_USER)
    expect(page.locator("#user-denials tbody tr", has_text="evil-x")).to_have_count(1)
    charted(page, "user-chart")
    console.screenshot("blocked-hostile")
    assert page.locator("body img, body script, body svg").count() == 0
    assert console.dialogs == []
