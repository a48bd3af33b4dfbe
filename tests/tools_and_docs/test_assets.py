"""GraphiQL works air-gapped: its scripts come from this service, exactly as Strawberry pins them."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app
from service.web.assets import AssetError, fetch, matches, pinned_assets, sri
from tests.vendor_assets import local_assets_or_skip

WIDGET = b"console.log('widget 1.2.3');\n"


def page_pinning(content: bytes) -> str:
    """A page shaped like Strawberry's, pinning one scoped package's file to content's hash."""
    return f"""<html><head>
    <script crossorigin src="https://unpkg.com/@demo/widget@1.2.3/dist/widget.js"
      integrity="{sri(content, "sha384")}"></script>
    </head></html>"""


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `npm` on PATH whose `pack` writes a tarball of the bytes in ./served; calls are logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    served = tmp_path / "served"
    served.write_bytes(WIDGET)
    script = bin_dir / "npm"
    script.write_text(
        f"""#!/usr/bin/env python3
import io, json, sys, tarfile
open({str(tmp_path / "calls")!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
content = open({str(served)!r}, "rb").read()
dest = sys.argv[sys.argv.index("--pack-destination") + 1]
with tarfile.open(dest + "/demo-widget-1.2.3.tgz", "w:gz") as tar:
    info = tarfile.TarInfo("package/dist/widget.js")
    info.size = len(content)
    tar.addfile(info, io.BytesIO(content))
print(json.dumps([{{"filename": "demo-widget-1.2.3.tgz"}}]))
"""
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


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


def test_fetch_stores_a_file_that_matches_its_pinned_hash(fake_npm: Path, tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    stored = fetch(vendor, page_pinning(WIDGET))

    assert stored == ["@demo/widget@1.2.3/dist/widget.js"]
    assert (vendor / "@demo/widget@1.2.3/dist/widget.js").read_bytes() == WIDGET
    assert (fake_npm / "calls").read_text().startswith("pack @demo/widget@1.2.3 ")

    # Already there and intact: nothing to do, npm is not even asked.
    assert fetch(vendor, page_pinning(WIDGET)) == []
    assert len((fake_npm / "calls").read_text().splitlines()) == 1


def test_a_download_that_does_not_match_is_refused_and_nothing_is_stored(
    fake_npm: Path, tmp_path: Path
) -> None:
    (fake_npm / "served").write_bytes(b"alert('tampered');\n")
    vendor = tmp_path / "vendor"

    with pytest.raises(AssetError) as refused:
        fetch(vendor, page_pinning(WIDGET))

    message = str(refused.value)
    assert "@demo/widget@1.2.3/dist/widget.js" in message
    assert sri(WIDGET, "sha384") in message and sri(b"alert('tampered');\n", "sha384") in message
    assert not vendor.exists()


def test_without_npm_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm anywhere

    with pytest.raises(AssetError, match="npm is not installed"):
        fetch(tmp_path / "vendor", page_pinning(WIDGET))


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
    advice = [r.getMessage() for r in caplog.records if "fetch-assets" in r.getMessage()]
    assert len(advice) == 1, advice


async def test_with_local_assets_graphiql_loads_everything_from_the_service_without_a_token(
    engine: AsyncEngine, settings: Settings
) -> None:
    vendor = local_assets_or_skip()
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
    shutil.copytree(local_assets_or_skip(), vendor)
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
