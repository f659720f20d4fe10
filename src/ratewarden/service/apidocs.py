"""The API documentation: Swagger UI at `/docs` and its OAuth2 redirect page, served from
the package under the console's security headers; `/redoc` now leads to `/docs`.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, with no Subresource Integrity,
and start them with an inline script. The daemon's origin is also the console's, whose
admin token sits in the tab's sessionStorage: a script served from elsewhere could read
it. So these pages are built like the console (service/console.py): their HTML is ours,
every script and style is a packaged file from an allow-list (`/docs/assets/{name}`,
never a path taken from the URL), and every response carries the console's
Content-Security-Policy, which runs nothing inline and loads nothing from another origin.
(Under it, Swagger UI's stylesheet cannot draw one `data:` image, a drop-down's arrow.)

Swagger UI's files come from the `fastapi-offline` package (its static/ folder, refreshed
from the upstream releases); the lines that start it are ours (apidocs_assets/). ReDoc
is not served: it styles the page through inline `<style>` elements, which the policy
refuses (it shows only "Something went wrong"), and one documentation page is enough.
The pages use relative URLs, so they also work behind a proxy that serves the daemon
under a prefix. auth.py lists every route here as open.
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Final

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from ratewarden.service.console import SECURITY_HEADERS

OURS: Final = ("ratewarden.service", "apidocs_assets")
VENDORED: Final = ("fastapi_offline", "static")
_JS: Final = "text/javascript; charset=utf-8"
_CSS: Final = "text/css; charset=utf-8"
# The only files `/docs/assets/{name}` serves: where each comes from, and its media type.
ASSETS: Final = {
    "swagger-ui-bundle.js": (VENDORED, _JS),
    "swagger-ui.css": (VENDORED, _CSS),
    "swagger-init.js": (OURS, _JS),
    "oauth2-redirect.js": (OURS, _JS),
}
_HTML: Final = "text/html; charset=utf-8"
_HEAD: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
"""

router = APIRouter(include_in_schema=False)


@cache
def _asset(name: str) -> bytes:
    """A packaged file's bytes, read once (`name` is one of ours, never the URL's)."""
    (package, folder), _ = ASSETS[name]
    return resources.files(package).joinpath(folder, name).read_bytes()


def _page(body: bytes | str, media_type: str, status_code: int = 200) -> Response:
    response = Response(body, status_code=status_code, media_type=media_type)
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = "no-cache"  # revalidated: a new version shows at once
    return response


def _openapi_url(request: Request) -> str:
    """The schema's URL as the browser must ask for it (behind a proxy, with its prefix)."""
    root: str = request.scope.get("root_path", "")
    return html.escape(root + (request.app.openapi_url or ""))


@router.get("/docs")
async def swagger_ui(request: Request) -> Response:
    page = (
        _HEAD.format(title=html.escape(request.app.title) + " - Swagger UI")
        + '<link rel="icon" type="image/svg+xml" href="console/assets/favicon.svg">\n'
        '<link rel="stylesheet" href="docs/assets/swagger-ui.css">\n'
        '<script src="docs/assets/swagger-ui-bundle.js" defer></script>\n'
        '<script src="docs/assets/swagger-init.js" defer></script>\n'
        "</head>\n<body>\n"
        f'<div id="swagger-ui" data-openapi-url="{_openapi_url(request)}" '
        f'data-oauth2-redirect-url="docs/oauth2-redirect"></div>\n'
        "</body>\n</html>\n"
    )
    return _page(page, _HTML)


@router.get("/docs/oauth2-redirect")
async def swagger_ui_oauth2_redirect() -> Response:
    page = (
        _HEAD.format(title="Swagger UI: OAuth2 Redirect")
        + '<script src="assets/oauth2-redirect.js"></script>\n'
        "</head>\n<body>\n</body>\n</html>\n"
    )
    return _page(page, _HTML)


@router.get("/redoc")
async def redoc() -> Response:
    """ReDoc's old address: Swagger UI (relative, so a proxy's prefix is kept)."""
    response = _page(b"", _HTML, status_code=307)
    response.headers["Location"] = "docs"
    return response


@router.get("/docs/assets/{name}")
async def docs_asset(name: str = Path(max_length=64)) -> Response:
    """One of the documentation's files (a fixed list of names)."""
    found = ASSETS.get(name)
    if found is None:
        return _page(b"not found", "text/plain; charset=utf-8", status_code=404)
    return _page(_asset(name), found[1])
