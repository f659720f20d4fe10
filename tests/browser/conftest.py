"""Fixtures for the browser tests: Debian's chromium driven by Playwright, a real daemon on
a real redis-server, and a signed-out console page per test.

Chromium is Debian's package (installed here when missing, as tests/helpers/redis_server.py
installs redis-server); Playwright drives it through `executable_path`, so no browser is
downloaded by `playwright install`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Dialog,
    Page,
    ViewportSize,
    expect,
    sync_playwright,
)

from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.debian import ensure_command
from tests.helpers.redis_server import running_redis

ADMIN_TOKEN = "console-admin-token-7f3a"
CHECK_TOKEN = "console-check-token-2b91"
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}
REPOSITORY = Path(__file__).parents[2]
# Set to 1 to refresh the README's screenshot (docs/img/console-user.png); CI leaves the
# tree alone and keeps every screenshot under pytest's temporary directory.
SAVE_SCREENSHOTS = os.environ.get("RATEWARDEN_SAVE_SCREENSHOTS") == "1"

POLICY = """\
version: 1
defaults: {mode: enforce, fail: closed}
rules:
  - name: no-evil-tools
    match: {tool: "evil*"}
    deny: "no evil tools"
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 2/minute
"""


def ensure_chromium() -> str:
    """Path of Debian's chromium, installing the package if it is not there."""
    return ensure_command("chromium")


@dataclass
class ConsoleDaemon:
    """The daemon under test, its policy file, and a client for the test's own calls."""

    daemon: Daemon
    policy: Path

    @property
    def url(self) -> str:
        return self.daemon.url

    def check(self, user: str, tool: str = "terminal") -> str:
        """One decision, as an agent's hook asks for it; its `decision`."""
        answer = self._http("POST", "/v1/check", CHECK_TOKEN, {"user": user, "tool": tool})
        decision: str = answer.json()["decision"]
        return decision

    def admin(self, method: str, path: str, body: object = None) -> httpx.Response:
        return self._http(method, path, ADMIN_TOKEN, body)

    def _http(self, method: str, path: str, token: str, body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=self.url, trust_env=False, timeout=5) as http:
            return http.request(method, path, headers=headers, json=body)


@contextlib.contextmanager
def console_serving(directory: Path, policy_text: str, **tokens: str) -> Iterator[ConsoleDaemon]:
    """`ratewarden serve` on its own redis-server in `directory`, with `policy_text`, one
    admin and one check token, and any other token settings in `tokens`."""
    policy = directory / "policy.yaml"
    policy.write_text(policy_text)
    env = clean_environment(
        RATEWARDEN_ADMIN_TOKENS=ADMIN_TOKEN, RATEWARDEN_API_TOKENS=CHECK_TOKEN, **tokens
    )
    with (
        running_redis(directory / "redis") as redis_server,
        running_daemon(
            directory, "--store-url", redis_server.url, "--policy", str(policy), env=env
        ) as daemon,
    ):
        yield ConsoleDaemon(daemon, policy)


@pytest.fixture(scope="module")
def console_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """The console's daemon (`console_serving`) on POLICY."""
    with console_serving(tmp_path_factory.mktemp("console"), POLICY) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless chromium for this module (the sync API's loop lives and ends here)."""
    executable = ensure_chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@dataclass
class Console:
    """One browser tab on the console, with what it asked for and what it popped up."""

    page: Page
    context: BrowserContext
    daemon: ConsoleDaemon
    screenshots: Path
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def sign_in(self, token: str = ADMIN_TOKEN) -> None:
        self.page.fill("#token", token)
        self.page.click("#sign-in-form button[type=submit]")

    def signed_in(self) -> None:
        self.sign_in()
        expect(self.page.locator("#nav")).to_be_visible()

    def open_view(self, name: str) -> None:
        self.page.click(f"#nav a[data-view={name}]")
        expect(self.page.locator(f"#view-{name}")).to_be_visible()

    def show_user(self, user: str) -> None:
        self.open_view("user")
        self.page.fill("#user-name", user)
        self.page.click("#user-form button[type=submit]")
        expect(self.page.locator("#user-title")).to_have_text(user)

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=path, full_page=True)
        return path

    def foreign_requests(self) -> list[str]:
        """Requests to anything but the daemon's origin (none are allowed)."""
        home = self.daemon.url + "/"
        return [url for url in self.requests if not url.startswith(home)]


@pytest.fixture
def open_console(
    browser: Browser, console_daemon: ConsoleDaemon, screenshots: Path
) -> Iterator[Callable[..., Console]]:
    """Open /console in a fresh browser context (no storage, no cookies) of a given size;
    afterwards, every tab must have stayed on the daemon's origin and popped nothing up."""
    opened: list[Console] = []

    def open_one(viewport: ViewportSize = DESKTOP) -> Console:
        context = browser.new_context(viewport=viewport, service_workers="block")
        page = context.new_page()
        console = Console(page, context, console_daemon, screenshots)
        context.on("request", lambda request: console.requests.append(request.url))

        def dismiss(dialog: Dialog) -> None:
            console.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", dismiss)
        page.goto(f"{console_daemon.url}/console")
        expect(page.locator("#sign-in")).to_be_visible()
        opened.append(console)
        return console

    yield open_one
    for console in opened:
        console.context.close()
    for console in opened:
        assert console.foreign_requests() == []
        assert console.dialogs == []
        assert not any(ADMIN_TOKEN in url for url in console.requests)


def save_for_docs(shot: Path, name: str) -> None:
    """Copy a screenshot into docs/img/ when asked to (RATEWARDEN_SAVE_SCREENSHOTS=1)."""
    if SAVE_SCREENSHOTS:
        target = REPOSITORY / "docs" / "img" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
