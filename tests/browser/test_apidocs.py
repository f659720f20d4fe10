"""The API documentation in a real browser (Debian's chromium, driven by Playwright) with
every request to anything but loopback refused: `/docs` (and `/redoc`, which leads there)
still renders the API from the daemon's own files, and every response that makes up the
page carries the console's Content-Security-Policy, which blocks nothing but one image
(issue 25, item 12). tests/service/test_apidocs.py checks the same pages over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Response, Route, expect

from ratewarden.service.console import CONTENT_SECURITY_POLICY
from tests.browser.conftest import ConsoleDaemon

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# The schema is data fetched by the page's script, not a part of the page: no policy.
DATA_TYPES = {"fetch", "xhr"}


@dataclass
class OfflineTab:
    """A tab that can reach loopback only, with what it asked for and what it was told."""

    page: Page
    context: BrowserContext
    refused: list[str] = field(default_factory=list)  # requests to anything else
    responses: list[Response] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # what the CSP blocked
    errors: list[str] = field(default_factory=list)  # uncaught script errors

    def page_responses(self) -> list[Response]:
        return [r for r in self.responses if r.request.resource_type not in DATA_TYPES]


def _only_loopback(tab: OfflineTab) -> Callable[[Route], None]:
    def handle(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            tab.refused.append(route.request.url)
            route.abort("internetdisconnected")

    return handle


@pytest.fixture
def open_offline(
    browser: Browser, console_daemon: ConsoleDaemon
) -> Iterator[Callable[..., OfflineTab]]:
    contexts: list[BrowserContext] = []

    def open_one(path: str) -> OfflineTab:
        context = browser.new_context(service_workers="block")
        contexts.append(context)
        page = context.new_page()
        tab = OfflineTab(page, context)
        context.route("**/*", _only_loopback(tab))
        # A lambda: Playwright marks its handlers, which a builtin method cannot carry.
        context.on("response", lambda response: tab.responses.append(response))  # noqa: PLW0108
        page.on("pageerror", lambda error: tab.errors.append(str(error)))
        page.on(
            "console",
            lambda message: (
                tab.violations.append(message.text)
                if "Content Security Policy" in message.text
                else None
            ),
        )
        page.goto(f"{console_daemon.url}{path}")
        return tab

    yield open_one
    for context in contexts:
        context.close()


def assert_served_whole_by_the_daemon(tab: OfflineTab, daemon: ConsoleDaemon) -> None:
    assert tab.refused == []
    assert tab.errors == []
    assert all(r.url.startswith(daemon.url + "/") for r in tab.responses)
    served = tab.page_responses()
    assert {r.request.resource_type for r in served} >= {"document", "script", "stylesheet"}
    for response in served:
        assert response.ok or response.status == 307, response.url  # 307: /redoc
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, response.url


def test_swagger_ui_renders_the_api_offline_under_the_policy(
    open_offline: Callable[..., OfflineTab], console_daemon: ConsoleDaemon
) -> None:
    tab = open_offline("/docs")
    expect(tab.page).to_have_title("ratewarden - Swagger UI")
    expect(tab.page.get_by_role("heading", level=1)).to_contain_text("ratewarden")
    check = tab.page.locator(".opblock-summary-path[data-path='/v1/check']")
    expect(check).to_be_visible()
    check.click()  # an operation opens, with its request body's schema
    expect(tab.page.locator(".opblock.is-open .opblock-section-request-body")).to_be_visible()
    assert_served_whole_by_the_daemon(tab, console_daemon)
    # The policy refuses one thing: swagger-ui.css's drop-down arrow, a `data:` image.
    assert tab.violations, "the policy was not in force"
    assert all(v.startswith("Loading the image 'data:image/svg+xml") for v in tab.violations)


def test_redoc_leads_to_swagger_ui(
    open_offline: Callable[..., OfflineTab], console_daemon: ConsoleDaemon
) -> None:
    tab = open_offline("/redoc")
    expect(tab.page).to_have_url(f"{console_daemon.url}/docs")
    expect(tab.page.locator(".opblock-summary-path[data-path='/v1/check']")).to_be_visible()
    assert_served_whole_by_the_daemon(tab, console_daemon)
