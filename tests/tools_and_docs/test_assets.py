"""GraphiQL works air-gapped: its scripts come from this service, exactly as Strawberry pins them."""

from __future__ import annotations

import http.server
import io
import json
import logging
import shutil
import socket
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app
from service.web.assets import AssetError, fetch, matches, pinned_assets, sri
from tests.support.vendor_assets import local_assets

WIDGET = b"console.log('widget 1.2.3');\n"


def page_pinning(content: bytes) -> str:
    """A page shaped like Strawberry's, pinning one scoped package's file to content's hash."""
    return f"""<html><head>
    <script crossorigin src="https://unpkg.com/@demo/widget@1.2.3/dist/widget.js"
      integrity="{sri(content, "sha384")}"></script>
    </head></html>"""


def tarball(files: dict[str, bytes]) -> bytes:
    """An npm package tarball: every file under package/."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


@dataclass
class FakeRegistry:
    """An npm registry on 127.0.0.1 serving @demo/widget 1.2.3; every path asked is logged."""

    url: str
    served: dict[str, bytes]  # the package's files
    asked: list[str]
    integrity: str | None = None  # the registry's hash of the tarball; None: computed


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRegistry]:
    registry = FakeRegistry("", {"dist/widget.js": WIDGET}, [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            registry.asked.append(self.path)
            packed = tarball(registry.served)
            if self.path == "/@demo%2fwidget/1.2.3":
                body = json.dumps(
                    {
                        "dist": {
                            "tarball": f"{registry.url}@demo/widget/-/widget-1.2.3.tgz",
                            "integrity": registry.integrity or sri(packed, "sha512"),
                        }
                    }
                ).encode()
            elif self.path == "/@demo/widget/-/widget-1.2.3.tgz":
                body = packed
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    registry.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("npm_config_registry", registry.url)
    yield registry
    server.shutdown()
    server.server_close()


def test_the_assets_are_the_ones_strawberrys_page_pins() -> None:
    assets = {a.spec: a for a in pinned_assets()}
    assert {"react@18.2.0", "react-dom@18.2.0", "js-cookie@3.0.5", "graphiql@3.8.3"} <= set(assets)
    explorer = assets["@graphiql/plugin-explorer@1.0.2"]
    assert explorer.package == "@graphiql/plugin-explorer"
    assert explorer.local_path in {
        "@graphiql/plugin-explorer@1.0.2/dist/index.umd.js",
        "@graphiql/plugin-explorer@1.0.2/dist/style.css",
    }
    assert all(a.integrity.startswith("sha384-") for a in pinned_assets())


def test_fetch_stores_a_file_that_matches_its_pinned_hash(
    fake_registry: FakeRegistry, tmp_path: Path
) -> None:
    vendor = tmp_path / "vendor"
    stored = fetch(vendor, page_pinning(WIDGET))

    assert stored == ["@demo/widget@1.2.3/dist/widget.js"]
    assert (vendor / "@demo/widget@1.2.3/dist/widget.js").read_bytes() == WIDGET
    assert fake_registry.asked == ["/@demo%2fwidget/1.2.3", "/@demo/widget/-/widget-1.2.3.tgz"]

    # Already there and intact: nothing to do, the registry is not even asked.
    assert fetch(vendor, page_pinning(WIDGET)) == []
    assert len(fake_registry.asked) == 2


def test_a_download_that_does_not_match_is_refused_and_nothing_is_stored(
    fake_registry: FakeRegistry, tmp_path: Path
) -> None:
    fake_registry.served["dist/widget.js"] = b"alert('tampered');\n"
    vendor = tmp_path / "vendor"

    with pytest.raises(AssetError) as refused:
        fetch(vendor, page_pinning(WIDGET))

    message = str(refused.value)
    assert "@demo/widget@1.2.3/dist/widget.js" in message
    assert sri(WIDGET, "sha384") in message and sri(b"alert('tampered');\n", "sha384") in message
    assert not vendor.exists()


def test_a_tarball_the_registry_does_not_vouch_for_is_refused(
    fake_registry: FakeRegistry, tmp_path: Path
) -> None:
    fake_registry.integrity = sri(b"another tarball", "sha512")

    with pytest.raises(AssetError, match="does not match the registry's integrity"):
        fetch(tmp_path / "vendor", page_pinning(WIDGET))
    assert not (tmp_path / "vendor").exists()


def test_without_the_registry_the_error_says_where_to_fetch_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{port}/")

    with pytest.raises(AssetError) as refused:
        fetch(tmp_path / "vendor", page_pinning(WIDGET))
    assert f"cannot reach the npm registry at http://127.0.0.1:{port}/" in str(refused.value)
    assert "copy service/static/vendor/" in str(refused.value)


@pytest.fixture
async def app_client(
    engine: AsyncEngine, settings: Settings, request: pytest.FixtureRequest
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, engine=engine, vendor_dir=request.param)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as client:
        yield client


BROWSER = {"Accept": "text/html,application/xhtml+xml"}


@pytest.mark.parametrize("app_client", [Path("/nonexistent/vendor")], indirect=True)
async def test_without_local_assets_graphiql_uses_the_cdn_and_says_once_how_to_fetch_them(
    app_client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.web.graphiql"):
        first = await app_client.get("/graphql", headers=BROWSER)
        second = await app_client.get("/graphql", headers=BROWSER)

    assert first.status_code == second.status_code == 200
    assert "https://unpkg.com/graphiql@3.8.3/graphiql.min.js" in first.text
    # Offline the page would say "Loading..." forever: it says what to run instead.
    assert "Loading...<" not in first.text
    assert "<code>llmgw-inventory fetch-assets</code>" in first.text
    advice = [r.getMessage() for r in caplog.records if "fetch-assets" in r.getMessage()]
    assert len(advice) == 1, advice


async def test_with_local_assets_graphiql_loads_everything_from_the_service_without_a_token(
    engine: AsyncEngine, settings: Settings
) -> None:
    vendor = local_assets()
    guarded = settings.replace(bootstrap_token="an-operator-token")
    app = create_app(guarded, engine=engine, vendor_dir=vendor)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as browser:
        # Tokens are in force: a query without one is refused...
        refused = await browser.post("/graphql", json={"query": "{ fabrics { name } }"})
        assert refused.status_code == 401

        # ...but the pages and their scripts are not queries.
        page = await browser.get("/graphql", headers=BROWSER)
        assert page.status_code == 200
        assert "unpkg.com" not in page.text

        for asset in pinned_assets():
            # Relative to /graphql, so a proxy's path prefix is kept.
            assert f'"static/vendor/{asset.local_path}"' in page.text
            # The integrity attribute stays: the browser checks our copy too.
            assert asset.integrity in page.text
            served = await browser.get(f"/static/vendor/{asset.local_path}")
            assert served.status_code == 200, asset.local_path
            assert matches(asset, served.content)
            kind = "css" if asset.path.endswith(".css") else "javascript"
            assert kind in served.headers["content-type"]

        dashboard = await browser.get("/")
        assert dashboard.status_code == 200 and "text/html" in dashboard.headers["content-type"]
        assert (await browser.get("/static/dashboard.js")).status_code == 200


async def test_an_altered_local_copy_is_not_used_and_the_log_names_it(
    engine: AsyncEngine,
    settings: Settings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vendor = tmp_path / "vendor"
    shutil.copytree(local_assets(), vendor)
    with (vendor / "graphiql@3.8.3" / "graphiql.min.js").open("ab") as bundle:
        bundle.write(b"\n/* edited by hand */\n")
    app = create_app(settings, engine=engine, vendor_dir=vendor)

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as browser:
        with caplog.at_level(logging.WARNING, logger="service.web.graphiql"):
            page = await browser.get("/graphql", headers=BROWSER)

    # Half local, half CDN would break in the browser anyway (SRI): all CDN instead.
    assert "static/vendor/" not in page.text
    assert "https://unpkg.com/react@18.2.0/umd/react.production.min.js" in page.text
    assert "graphiql@3.8.3/graphiql.min.js" in caplog.text
