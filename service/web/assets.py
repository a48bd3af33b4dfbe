"""GraphiQL's browser assets, fetched from the npm registry and checked against Strawberry's page.

Strawberry's GraphiQL page loads React, GraphiQL and the explorer plugin from a
CDN, pinned by version and by SRI hash. An air-gapped cluster has no CDN, so
`llmgw-inventory fetch-assets` runs `npm pack` for exactly those versions at
install or image-build time and keeps the files only when they match the page's
own hashes byte for byte. The list of assets is read from Strawberry's page every
time rather than copied here: a Strawberry upgrade that moves a version or a hash
moves what we fetch with it, and there is no second copy of the hashes to drift.
Third-party bundles are never committed to the repository.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import subprocess
import tarfile
import tempfile
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


def _npm_pack(spec: str, into: Path) -> Path:
    try:
        done = subprocess.run(
            ["npm", "pack", spec, "--json", "--silent", "--pack-destination", str(into)],
            cwd=into,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except FileNotFoundError:
        raise AssetError(
            "npm is not installed: install Node.js (npm), or fetch-assets on a machine with npm "
            "and copy service/static/vendor/"
        ) from None
    except subprocess.TimeoutExpired:
        raise AssetError(f"npm pack {spec} took longer than 300 s") from None
    if done.returncode != 0:
        raise AssetError(f"npm pack {spec} failed (exit {done.returncode}): {done.stderr.strip()}")
    try:
        filename = str(json.loads(done.stdout)[0]["filename"])
    except (ValueError, LookupError, TypeError):
        raise AssetError(f"npm pack {spec}: unexpected output {done.stdout[:200]!r}") from None
    # Scoped packages: npm names the tarball "graphiql-plugin-explorer-1.0.2.tgz".
    return into / os.path.basename(filename)


def _read_member(tarball: Path, asset: Asset) -> bytes:
    with tarfile.open(tarball, "r:gz") as archive:
        try:
            member = archive.extractfile(f"package/{asset.path}")
        except KeyError:
            member = None
        if member is None:
            raise AssetError(f"{asset.spec} has no file {asset.path}")
        return member.read()


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
    with tempfile.TemporaryDirectory(prefix="llmgw-assets-") as scratch:
        tarballs: dict[str, Path] = {}
        for asset in assets:
            if asset.local_path not in wanted:
                continue
            if asset.spec not in tarballs:
                log.info("npm pack %s", asset.spec)
                tarballs[asset.spec] = _npm_pack(asset.spec, Path(scratch))
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
