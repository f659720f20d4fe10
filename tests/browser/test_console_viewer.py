"""The console for a viewer token, in a real browser against a real `ratewarden serve` on
a real redis-server: a viewer signs in, reads the live refusals, a user's usage, overrides
and the policy, and is shown no control that would reset, override or reload; an admin,
signed in beside it, is shown them all.

The daemon here has a viewer token besides the admin and check tokens of the other
console tests (this module's `console_daemon` replaces conftest.py's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import (
    POLICY,
    Console,
    ConsoleDaemon,
    console_serving,
)

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

OpenConsole = Callable[..., Console]
VIEWER_TOKEN = "console-viewer-token-9c4e"
RULE = "terminal-per-minute"  # 2 calls a minute per user


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """The console's daemon with a viewer token too."""
    directory = tmp_path_factory.mktemp("console-viewer")
    with console_serving(directory, POLICY, RATEWARDEN_VIEWER_TOKENS=VIEWER_TOKEN) as daemon:
        yield daemon


def exhaust(daemon: ConsoleDaemon, user: str) -> None:
    """Use up `user`'s two terminal calls; the third is refused."""
    assert [daemon.check(user) for _ in range(3)] == ["allow", "allow", "deny"]


def override_for(daemon: ConsoleDaemon, user: str) -> str:
    """A runtime override naming `user`, set by the admin API; its id."""
    made = daemon.admin(
        "POST",
        "/v1/admin/overrides",
        {"users": [user], "rule": RULE, "rate": "5/minute", "ttl": "10m", "reason": "demo"},
    )
    assert made.status_code == 201, made.text
    override_id: str = made.json()["id"]
    return override_id


def test_a_viewer_reads_everything_and_is_shown_no_control(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    user = "vera-viewed"
    exhaust(console_daemon, user)
    override_for(console_daemon, user)
    console = open_console()
    page = console.page
    console.sign_in(VIEWER_TOKEN)
    expect(page.locator("#nav")).to_be_visible()
    expect(page.locator("#role")).to_have_text("viewer: read only")
    assert page.evaluate("sessionStorage.length") == 1

    # The live refusals: the user's refusal is there.
    console.open_view("refusals")
    row = page.locator("#refusals-table tbody tr", has_text=user)
    expect(row.first).to_contain_text(RULE)
    expect(row.first).to_contain_text("deny")

    # The user view: usage (under the override's limit), the override, the refusals; no
    # reset, no override form, no remove.
    console.show_user(user)
    usage = page.locator(f"#usage-table tbody tr[data-rule={RULE}]")
    expect(usage).to_contain_text("5/minute")
    expect(page.locator("#overrides-table tbody tr").first).to_contain_text("demo")
    expect(page.locator("#user-denials tbody tr").first).to_contain_text(RULE)
    expect(page.get_by_role("button", name=f"Reset {RULE}")).to_be_hidden()
    expect(page.locator("#override-form")).to_be_hidden()
    expect(page.get_by_role("heading", name="Grant a temporary override")).to_be_hidden()
    expect(page.locator("#overrides-table button")).to_be_hidden()
    # Beside Show, only the chart's switches (data-value: last hour, last day), which read.
    visible = page.locator("#view-user button:visible:not([data-value])")
    assert visible.all_inner_texts() == ["Show"]
    console.screenshot("viewer-user")

    # The policy: its rules, and no reload button.
    console.open_view("policy")
    expect(page.locator("#policy-rules tbody")).to_contain_text(RULE)
    expect(page.locator("#reload-button")).to_be_hidden()

    # The overview reads the fleet's figures as for an admin.
    console.open_view("overview")
    expect(page.locator("#overview-decisions")).not_to_have_text("-")
    console.screenshot("viewer-overview")


def test_an_admin_beside_it_is_shown_the_controls(
    open_console: OpenConsole, console_daemon: ConsoleDaemon
) -> None:
    user = "adam-admin"
    exhaust(console_daemon, user)
    override_for(console_daemon, user)
    console = open_console()
    page = console.page
    console.signed_in()
    console.show_user(user)
    expect(page.get_by_role("button", name=f"Reset {RULE}")).to_be_visible()
    expect(page.locator("#override-form")).to_be_visible()
    expect(page.get_by_role("heading", name="Grant a temporary override")).to_be_visible()
    expect(page.locator("#overrides-table button").first).to_be_visible()
    expect(page.locator("#role")).to_be_hidden()
    console.open_view("policy")
    expect(page.locator("#reload-button")).to_be_visible()
    console.screenshot("admin-user-controls")


def test_the_daemon_refuses_a_viewer_what_the_page_hides(console_daemon: ConsoleDaemon) -> None:
    """Hiding is for the eye; the daemon is what refuses (403 naming the role)."""
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    with httpx.Client(base_url=console_daemon.url, trust_env=False, headers=viewer) as http:
        assert http.get("/v1/whoami").json() == {"role": "viewer", "name": None}
        refused = [
            http.post("/v1/admin/reset", json={"user": "anyone", "rule": RULE}),
            http.post("/v1/admin/reload"),
            http.post("/v1/admin/overrides", json={"users": ["x"], "rule": RULE, "reason": "r"}),
            http.delete("/v1/admin/overrides/ovr_x"),
        ]
        for answer in refused:
            assert answer.status_code == 403, answer.request.url
            assert "a viewer token may only read" in answer.json()["message"]
