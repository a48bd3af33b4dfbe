"""GraphiQL's browser assets, fetched from the npm registry and checked against Strawberry's page.

Strawberry's GraphiQL page loads React, GraphiQL and the explorer plugin from a
CDN, pinned by version and by SRI hash. An air-gapped cluster has no CDN, so
the service keeps its own copies: the service's wheel carries them (setup.py
fetches them when it builds), `python3 dev.py serve` fetches them into a
checkout, and `llmgw-inventory fetch-assets` does it by hand. Each file is
taken from its package's tarball on the npm registry, read over HTTPS with
nothing but Python (a fresh machine has no npm), and kept only when it matches
the page's own hash byte for byte. The list of assets is read from Strawberry's
page every time rather than copied here: a Strawberry upgrade that moves a
version or a hash moves what we fetch with it, and there is no second copy of
the hashes to drift. Third-party bundles are never committed to the repository.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import strawberry

log = logging.getLogger(__name__)

CDN_PREFIX = "https://unpkg.com/"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
VENDOR_DIR = STATIC_DIR / "vendor"
STRAWBERRY_PAGE = Path(strawberry.__file__).resolve().parent / "static" / "graphiql.html"


class AssetError(RuntimeError):
    """An asset could not be fetched or does not match its pinned hash; nothing was stored."""


@dataclass(frozen=True)
class Asset:
    """One file the page loads: `https://unpkg.com/<package>@<version>/<path>`, with its SRI hash."""

    package: str
    version: str
    path: str
    integrity: str

    @property
    def cdn_url(self) -> str:
        return f"{CDN_PREFIX}{self.spec}/{self.path}"

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def local_path(self) -> str:
        """Where it lives under the vendor directory (and under /static/vendor/)."""
        return f"{self.spec}/{self.path}"


class _PinnedAssets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        url = values.get("src") if tag == "script" else values.get("href")
        integrity = values.get("integrity")
        if url and url.startswith(CDN_PREFIX):
            if not integrity:
                # Without a hash we could not tell a good copy from a tampered one.
                raise AssetError(f"{url} has no integrity hash in Strawberry's page")
            self.found.append((url, integrity))


def pinned_assets(page: str | None = None) -> list[Asset]:
    """The CDN files Strawberry's GraphiQL page loads, each with its version and SRI hash."""
    parser = _PinnedAssets()
    parser.feed(STRAWBERRY_PAGE.read_text() if page is None else page)
    assets = []
    for url, integrity in parser.found:
        rest = url[len(CDN_PREFIX) :]
        # "@graphiql/plugin-explorer@1.0.2/dist/style.css": a scoped name has
        # one more slash, and its version follows the *second* "@".
        scope_slash = rest.find("/") + 1 if rest.startswith("@") else 0
        spec_end = rest.index("/", scope_slash)
        package, _, version = rest[:spec_end].rpartition("@")
        if not package or not version:
            raise AssetError(f"{url}: expected {CDN_PREFIX}<package>@<version>/<path>")
        assets.append(Asset(package, version, rest[spec_end + 1 :], integrity))
    if not assets:
        raise AssetError(f"no CDN assets found in {STRAWBERRY_PAGE}")
    return assets


def sri(content: bytes, algorithm: str) -> str:
    """The Subresource Integrity value of content, e.g. 'sha384-...'."""
    digest = hashlib.new(algorithm, content).digest()
    return f"{algorithm}-{base64.b64encode(digest).decode()}"


def matches(asset: Asset, content: bytes) -> bool:
    algorithm = asset.integrity.partition("-")[0]
    if algorithm not in {"sha256", "sha384", "sha512"}:
        raise AssetError(f"{asset.cdn_url}: unsupported integrity algorithm {algorithm!r}")
    return sri(content, algorithm) == asset.integrity


def missing_or_altered(vendor_dir: Path, assets: list[Asset]) -> list[str]:
    """The assets not present under vendor_dir with their pinned content; empty when all are."""
    bad = []
    for asset in assets:
        file = vendor_dir / asset.local_path
        if not file.is_file() or not matches(asset, file.read_bytes()):
            bad.append(asset.local_path)
    return bad


# npm's own setting for its registry (a mirror), read as npm reads it from the environment.
REGISTRY_VARIABLES = ("npm_config_registry", "NPM_CONFIG_REGISTRY")
DEFAULT_REGISTRY = "https://registry.npmjs.org/"
FETCH_TIMEOUT = 60.0


def registry() -> str:
    for name in REGISTRY_VARIABLES:
        if value := os.environ.get(name):
            return value if value.endswith("/") else value + "/"
    return DEFAULT_REGISTRY


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as error:
        raise AssetError(f"GET {url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise AssetError(
            f"cannot reach the npm registry at {url} ({reason}): fetch the assets where it is "
            "reachable (npm_config_registry names a mirror) and copy service/static/vendor/"
        ) from None


def _tarball(spec: str, package: str, version: str) -> bytes:
    """The package's tarball, checked against the registry's own integrity hash when it gives one."""
    metadata_url = f"{registry()}{package.replace('/', '%2f')}/{version}"
    try:
        dist = json.loads(_get(metadata_url))["dist"]
        url = str(dist["tarball"])
    except (ValueError, LookupError, TypeError):
        raise AssetError(f"{metadata_url}: not the npm registry's answer for {spec}") from None
    content = _get(url)
    integrity = dist.get("integrity") if isinstance(dist, dict) else None
    if isinstance(integrity, str) and "-" in integrity:
        algorithm = integrity.partition("-")[0]
        if algorithm in {"sha256", "sha384", "sha512"} and sri(content, algorithm) != integrity:
            raise AssetError(f"{url} does not match the registry's integrity {integrity}")
    return content


def _read_member(tarball: bytes, asset: Asset) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
            try:
                member = archive.extractfile(f"package/{asset.path}")
            except KeyError:
                member = None
            if member is None:
                raise AssetError(f"{asset.spec} has no file {asset.path}")
            return member.read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise AssetError(f"{asset.spec}: its tarball cannot be read ({error})") from None


def fetch(vendor_dir: Path = VENDOR_DIR, page: str | None = None) -> list[str]:
    """Fetch every pinned asset that is missing or altered; returns the ones it stored.

    All or nothing: every file is checked before any is written, so a bad
    download leaves the previous (good or absent) set as it was.
    """
    assets = pinned_assets(page)
    wanted = set(missing_or_altered(vendor_dir, assets))
    if not wanted:
        return []
    contents: dict[str, bytes] = {}
    tarballs: dict[str, bytes] = {}
    for asset in assets:
        if asset.local_path not in wanted:
            continue
        if asset.spec not in tarballs:
            log.info("fetching %s from %s", asset.spec, registry())
            tarballs[asset.spec] = _tarball(asset.spec, asset.package, asset.version)
        content = _read_member(tarballs[asset.spec], asset)
        if not matches(asset, content):
            algorithm = asset.integrity.partition("-")[0]
            raise AssetError(
                f"{asset.spec}/{asset.path} does not match Strawberry's pinned hash: "
                f"expected {asset.integrity}, got {sri(content, algorithm)}; nothing was stored"
            )
        contents[asset.local_path] = content
    for local_path, content in contents.items():
        target = vendor_dir / local_path
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written aside then renamed: a reader never sees half a bundle.
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(content)
        partial.replace(target)
    return sorted(contents)
