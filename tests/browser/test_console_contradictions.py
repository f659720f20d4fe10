"""The console's small contradictions, fixed (issue 30, item 8), in a real browser (Debian's
chromium through Playwright) against a real `ratewarden serve` on a real redis-server:

- a refusal record names the rule whose message it carries;
- the override form follows the chosen user and rule (a budget rule offers a budget);
- durations read as the model's messages word them (`19h57m`, not `71822s`);
- the policy view shows the file as YAML, with its groups, overrides and the runtime ones;
- every view fits a 375 px screen: tables become cards, messages wrap, nothing scrolls
  sideways.

The module runs its own daemon, with a policy that has two rules on one tool, a budget,
groups and overrides. Each test uses its own user names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from playwright.sync_api import ViewportSize, expect

from ratewarden.policy.durations import humanize_seconds
from tests.browser.conftest import (
    Console,
    ConsoleDaemon,
    console_serving,
)

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

OpenConsole = Callable[..., Console]
NARROW: ViewportSize = {"width": 375, "height": 800}
LIVE_MS = 2000  # the refusals view polls every second
# Two rules refuse a user's second terminal call; the hour's refusal holds longest, so the
# decision carries its message though the minute's rule is listed first.
POLICY = r"""version: 1
defaults: {mode: enforce, fail: closed}
groups:
  staff: [alice-staff, "ops-*"]
tools:
  browser: {cost: 1.25}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 1/minute
  - name: terminal-per-hour
    match: {tool: terminal}
    per: [user]
    rate: 1/hour
  - name: browser-daily
    match: {tool: browser}
    per: [user]
    budget: 5.00/day
  - name: no-root-delete
    match:
      tool: shell
      args: {command: {regex: '\brm\s+/'}}
    deny: "Refusing to delete the root directory"
overrides:
  - groups: [staff]
    rule: terminal-per-hour
    unlimited: true
"""
MINUTE, HOUR, BUDGET = "terminal-per-minute", "terminal-per-hour", "browser-daily"


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """This module's daemon (the conftest's `open_console` opens the console on it)."""
    with console_serving(tmp_path_factory.mktemp("contradictions"), POLICY) as daemon:
        yield daemon


def refused_twice(daemon: ConsoleDaemon, user: str) -> None:
    """The user's second terminal call is refused by both terminal rules."""
    assert [daemon.check(user) for _ in range(2)] == ["allow", "deny"]


def spent(daemon: ConsoleDaemon, user: str) -> None:
    """Four browser calls at 1.25 hold the whole 5.00 of the day; the fifth is refused."""
    assert [daemon.check(user, "browser") for _ in range(5)] == ["allow"] * 4 + ["deny"]


def usage_of(daemon: ConsoleDaemon, user: str, rule: str) -> dict[str, Any]:
    limits = daemon.admin("GET", f"/v1/usage?user={user}").json()["limits"]
    [item] = [item for item in limits if item["rule"] == rule]
    found: dict[str, Any] = item
    return found


def test_a_refusal_names_the_rule_whose_message_it_shows(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    user = "ann-two-rules"
    refused_twice(console_daemon, user)
    [entry] = console_daemon.admin("GET", f"/v1/denials?user={user}").json()["denials"]
    assert entry["rules"] == [MINUTE, HOUR]
    assert (entry["rule"], entry["reason"]) == (HOUR, "rate")
    assert "per hour" in entry["message"]

    console = open_console()
    console.signed_in()
    console.open_view("refusals")
    console.page.fill("#filter-user", user)
    row = console.page.locator("#refusals-table tbody tr", has_text=user)
    expect(row).to_have_count(1, timeout=LIVE_MS)
    cells = row.locator("td")
    expect(cells.nth(3)).to_have_text(HOUR)  # time, user, tool, rule, decision, message
    expect(cells.nth(5)).to_contain_text("per hour")
    console.screenshot("refusal-rule-and-message")
    console.show_user(user)
    mine = console.page.locator("#user-denials tbody tr")
    expect(mine).to_have_count(1)
    expect(mine.locator("td").nth(2)).to_have_text(HOUR)
    expect(mine.locator("td").nth(4)).to_contain_text("per hour")


def kinds(console: Console) -> list[str]:
    options: list[str] = console.page.eval_on_selector_all(
        "#override-kind option", "options => options.map(o => o.value)"
    )
    return options


def test_the_override_form_follows_the_user_and_the_rule(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    spender, typist = "ben-budget", "cy-terminal"
    spent(console_daemon, spender)
    refused_twice(console_daemon, typist)
    console = open_console()
    console.signed_in()
    page = console.page

    console.show_user(spender)  # the rule at its limit, with a budget to offer
    expect(page.locator("#override-rule")).to_have_value(BUDGET)
    expect(page.locator("#override-kind")).to_have_value("budget")
    assert kinds(console) == ["budget", "unlimited"]
    expect(page.locator("#override-value")).to_have_attribute("placeholder", "5.00/day")
    page.fill("#override-value", "20.00/day")
    page.fill("#override-reason", "ticket 7: a bigger browser day")
    page.click("#override-form button[type=submit]")
    expect(page.locator("#override-message")).to_contain_text("Override granted")
    expect(page.locator("#override-message")).to_contain_text("budget 20.00/day")
    console.screenshot("override-budget")
    listed = console_daemon.admin("GET", "/v1/admin/overrides").json()["overrides"]
    [granted] = [o for o in listed if o.get("users") == [spender]]
    assert (granted["rule"], granted["budget"]) == (BUDGET, "20.00/day")

    page.fill("#override-value", "half typed")  # left behind when another user is chosen
    page.fill("#override-ttl", "2h")
    page.fill("#override-reason", "meant for ben")
    console.show_user(typist)
    expect(page.locator("#override-rule")).to_have_value(MINUTE)  # the first at its limit
    expect(page.locator("#override-kind")).to_have_value("rate")
    assert kinds(console) == ["rate", "unlimited"]
    expect(page.locator("#override-value")).to_have_value("")
    expect(page.locator("#override-ttl")).to_have_value("10m")
    expect(page.locator("#override-reason")).to_have_value("")
    expect(page.locator("#override-message")).to_be_hidden()

    page.fill("#override-value", "5/minute")
    page.select_option("#override-rule", BUDGET)  # another rule: its own kind, a new value
    expect(page.locator("#override-kind")).to_have_value("budget")
    expect(page.locator("#override-value")).to_have_value("")
    page.select_option("#override-rule", HOUR)
    expect(page.locator("#override-kind")).to_have_value("rate")
    expect(page.locator("#override-value")).to_have_attribute("placeholder", "20/hour")
    page.select_option("#override-kind", "unlimited")
    expect(page.locator("#override-value")).to_be_disabled()
    console.screenshot("override-follows")


# Seconds -> what the model is told (policy/durations.py), and the page must say the same.
DURATIONS = [0, 0.2, 1, 1.5, 12, 59, 59.01, 60, 61, 90, 200, 3599, 3599.5, 3600, 3601, 3660]
DURATIONS += [7500, 71822, 86399, 86400, 86400 * 2 + 5, 604800, 2678400]


def test_durations_read_as_the_models_messages(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    console = open_console()
    console.signed_in()
    worded = console.page.evaluate(
        "values => values.map(window.ratewardenConsole.humanizeSeconds)", DURATIONS
    )
    assert worded == [humanize_seconds(seconds) for seconds in DURATIONS]
    assert humanize_seconds(71822) == "19h57m"  # the "Resets in 71822s"

    user = "dee-resets"
    spent(console_daemon, user)
    before = usage_of(console_daemon, user, BUDGET)["reset_after"]
    console.show_user(user)
    resets = console.page.locator(f"#usage-table tbody tr[data-rule='{BUDGET}'] td").nth(5)
    expect(resets).not_to_have_text("-")
    after = usage_of(console_daemon, user, BUDGET)["reset_after"]
    assert resets.inner_text() in {humanize_seconds(before), humanize_seconds(after)}
    console.screenshot("resets-in")


# Strings YAML would read as something else unless quoted, and plain ones it must keep.
AWKWARD: dict[str, Any] = {
    "words": ["yes", "No", "null", "~", "true", "on", "1.5", "1e3", "0x1F", "12:30", "2026-01-01"],
    "marks": ["a: b", "x #y", "#x", "-x", "*x", "&x", "!x", "@x", "'q'", '"q"', "", " pad "],
    "plain": ["5.00/day", "2/minute", "3/10 minutes", "80%", "1h", "ops-*", "evil*"],
    "escapes": ["\\brm\\s+/", "line\nbreak", "tab\there", "caf\u00e9", "it's"],
    "numbers": [0, 1, -2, 1.25],
    "flags": [True, False, None],
    "empty": {"list": [], "map": {}},
    "nested": [[1, [2, 3]], {"a": {"b": [{"c": "d"}]}}],
    "key: with colon": 1,
    "yes": "key reserved",
}


def test_the_policy_view_shows_the_file_as_yaml(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    made = console_daemon.admin(
        "POST",
        "/v1/admin/overrides",
        {
            "users": ["eve-runtime"],
            "rule": MINUTE,
            "rate": "5/minute",
            "ttl": "1h",
            "reason": "shown in the policy view",
        },
    )
    assert made.status_code == 201, made.text
    console = open_console()
    console.signed_in()
    rendered = console.page.evaluate("value => window.ratewardenConsole.toYaml(value)", AWKWARD)
    assert yaml.safe_load(rendered) == AWKWARD
    console.open_view("policy")
    page = console.page
    shown = page.locator("#policy-yaml")
    expect(shown).to_contain_text("groups:")
    text = shown.inner_text()
    document = console_daemon.admin("GET", "/v1/policy").json()["policy"]
    assert yaml.safe_load(text) == document  # the whole file, nothing lost or changed
    assert "overrides:" in text
    assert "staff:" in text
    assert r"regex: '\brm\s+/'" in text  # as the file has it, not JSON's "\\brm\\s+/"
    assert "{" not in text.split("rules:")[1].split("no-root-delete")[0]  # block style
    matches = page.locator("#policy-rules tbody tr", has_text="no-root-delete").locator("td")
    expect(matches.nth(1)).to_have_text(r"tool: [shell], args: {command: {regex: '\brm\s+/'}}")

    runtime = page.locator("#policy-runtime")
    expect(runtime).to_contain_text("eve-runtime")
    listed = yaml.safe_load(runtime.inner_text())["runtime_overrides"]
    [mine] = [item for item in listed if item["id"] == made.json()["id"]]
    assert (mine["users"], mine["rule"], mine["rate"]) == (["eve-runtime"], MINUTE, "5/minute")
    assert mine["reason"] == "shown in the policy view"
    console.screenshot("policy-yaml")


def overflowing(console: Console, view: str) -> list[str]:
    """What in the shown view reaches past the screen's right edge or scrolls sideways."""
    found: list[str] = console.page.evaluate(
        """view => {
          const width = document.documentElement.clientWidth;
          const problems = [];
          if (document.documentElement.scrollWidth > width) {
            problems.push(`page ${document.documentElement.scrollWidth} px wide`);
          }
          const shown = document.getElementById(`view-${view}`);
          for (const node of shown.querySelectorAll(".table-wrap, pre, td, th, input, select")) {
            if (node.offsetParent === null) continue;  // not displayed
            const right = node.getBoundingClientRect().right;
            if (right > width + 0.5) problems.push(`${node.tagName} ${node.id} ends at ${right}`);
            if (node.scrollWidth > node.clientWidth + 1 && node.matches(".table-wrap, pre")) {
              problems.push(`${node.tagName} ${node.id} scrolls: ${node.scrollWidth} px`);
            }
          }
          return problems;
        }""",
        view,
    )
    return found


def test_every_view_fits_375_px(open_console: OpenConsole, console_daemon: ConsoleDaemon) -> None:
    user = "frank-with-a-rather-long-user-name-for-a-phone@example.com"
    refused_twice(console_daemon, user)
    spent(console_daemon, user)
    made = console_daemon.admin(
        "POST",
        "/v1/admin/overrides",
        {"users": [user], "rule": HOUR, "unlimited": True, "ttl": "1h", "reason": "phone " * 30},
    )
    assert made.status_code == 201, made.text
    console = open_console(NARROW)
    console.signed_in()
    for view in ("overview", "refusals", "policy", "user"):
        if view == "user":
            console.show_user(user)
            granted = console.page.locator("#overrides-table tbody tr", has_text="phone")
            expect(granted).to_be_visible()
        else:
            console.open_view(view)
        if view == "refusals":
            listed = console.page.locator("#refusals-table tbody tr", has_text=user)
            expect(listed.first).to_be_visible(timeout=LIVE_MS)
        if view == "policy":
            expect(console.page.locator("#policy-yaml")).to_contain_text("rules:")
        console.page.wait_for_load_state("networkidle")
        assert overflowing(console, view) == [], view
        console.screenshot(f"narrow-{view}")
    # A message is shown whole, wrapped on the screen, with its column's name.
    message = console.page.locator("#user-denials tbody td[data-label=Message]").first
    expect(message).to_contain_text("(retry in ")
    assert message.bounding_box()["width"] <= NARROW["width"]  # type: ignore[index]


def test_the_narrow_layout_keeps_the_wide_one(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    """On a desktop the tables stay tables: the cards are for narrow screens only."""
    user = "gus-wide"
    refused_twice(console_daemon, user)
    console = open_console()
    console.signed_in()
    console.show_user(user)
    display = console.page.evaluate(
        "getComputedStyle(document.querySelector('#user-denials thead')).display"
    )
    assert display == "table-header-group"
    labels = console.page.evaluate(
        "getComputedStyle(document.querySelector('#user-denials tbody td'), '::before').content"
    )
    assert labels in ("none", "normal")  # no "Column:" before each cell
