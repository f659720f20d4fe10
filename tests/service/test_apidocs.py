"""The API documentation pages (`/docs`, `/docs/oauth2-redirect`, and `/redoc`, which now
leads to `/docs`) over HTTP: served from the package with the console's
Content-Security-Policy, naming no other origin (issue 25, item 12).
tests/browser/test_apidocs.py renders them in a browser."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from ratewarden.service.console import CONTENT_SECURITY_POLICY
from tests.helpers.app import build_app, serving

POLICY = """
version: 1
rules:
  - {name: calls, rate: 10/minute}
"""
PAGES = ["/docs", "/docs/oauth2-redirect"]
# Every URL a page names: where it loads scripts, styles and icons from.
_REFERENCE = re.compile(r"""\b(?:src|href|data-[\w-]+)\s*=\s*["']([^"']*)["']""")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(build_app(POLICY)) as http:
        yield http


def references(html: str) -> list[str]:
    return _REFERENCE.findall(html)


def resolved(page: str, reference: str) -> str:
    """`reference` as the browser resolves it on `page` (relative to the page's folder)."""
    return str(httpx.URL(f"http://test{page}").join(reference).path)


@pytest.mark.parametrize("page", PAGES)
async def test_a_docs_page_names_no_other_origin(client: httpx.AsyncClient, page: str) -> None:
    answer = await client.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    html = answer.text
    # No scheme, no protocol-relative URL, no CDN: nothing is loaded from elsewhere.
    assert "://" not in html
    assert not re.search(r"""["']//""", html)
    for reference in references(html):
        assert not reference.startswith(("//", "http:", "https:", "data:")), reference
    # Nothing inline either (the CSP would refuse it): every script is one of ours.
    assert html.count("<script") == html.count('<script src="'), html
    assert "<style" not in html
    assert " style=" not in html


@pytest.mark.parametrize("page", PAGES)
async def test_a_docs_page_carries_the_consoles_policy(
    client: httpx.AsyncClient, page: str
) -> None:
    answer = await client.get(page)
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"


async def test_every_file_the_docs_page_loads_is_packaged(client: httpx.AsyncClient) -> None:
    html = (await client.get("/docs")).text
    loaded = [
        resolved("/docs", reference)
        for reference in references(html)
        if reference.endswith((".js", ".css", ".svg"))
    ]
    assert any(path.endswith(".js") for path in loaded), html
    for path in loaded:
        asset = await client.get(path)
        assert asset.status_code == 200, path
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert asset.headers["x-content-type-options"] == "nosniff", path


async def test_redoc_leads_to_the_docs_under_the_policy(client: httpx.AsyncClient) -> None:
    """ReDoc cannot run under the policy (it styles the page inline): its address leads to
    Swagger UI, relatively, so that a proxy's prefix is kept."""
    answer = await client.get("/redoc")
    assert answer.status_code == 307
    assert answer.headers["location"] == "docs"
    assert resolved("/redoc", answer.headers["location"]) == "/docs"
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "redoc.standalone.js" not in (await client.get("/docs")).text


async def test_the_docs_assets_are_an_allow_list(client: httpx.AsyncClient) -> None:
    bundle = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert "SwaggerUIBundle" in bundle.text
    for name in ("index.html", "apidocs.py", "__init__.py", "core.py", "redoc.standalone.js"):
        missing = await client.get(f"/docs/assets/{name}")
        assert missing.status_code == 404, name
        assert missing.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
