"""What the service's build does that pyproject.toml cannot declare: its wheel is whole on its own.

A wheel installed on a server has no checkout around it, so a non-editable
build puts two things inside the package that a checkout keeps beside it or
fetches:

- the migrations: the repository's alembic/, copied to
  service/database/schema_migrations/, where service/database/migrations.py
  looks first;
- GraphiQL's scripts: fetched from the npm registry and checked against
  Strawberry's pinned hashes (service/web/assets.py, as `fetch-assets` does),
  so GraphiQL works offline from the first `serve`. A build that cannot get
  them fails, naming why; it never makes a wheel without them.

An editable install (`python3 dev.py install`) reads both from the checkout.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
MIGRATIONS = Path("service", "database", "schema_migrations")
VENDOR = Path("service", "static", "vendor")


def _graphiql_assets(into: Path) -> None:
    """Fetch what is missing into the checkout, copy it into the build, and check the copy."""
    sys.path.insert(0, str(ROOT))
    from service.web.assets import AssetError, fetch, missing_or_altered, pinned_assets

    try:
        fetch(ROOT / VENDOR)
    except AssetError as error:
        raise SystemExit(f"GraphiQL's scripts for the wheel: {error}") from None
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(ROOT / VENDOR, into, ignore=shutil.ignore_patterns("*.partial"))
    if bad := missing_or_altered(into, pinned_assets()):
        raise SystemExit(f"GraphiQL's scripts in the build are missing or altered: {bad}")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout's alembic/ and static/vendor/ are read where they are
        built = Path(self.build_lib)
        shutil.rmtree(built / MIGRATIONS, ignore_errors=True)
        shutil.copytree(
            ROOT / "alembic", built / MIGRATIONS, ignore=shutil.ignore_patterns("__pycache__")
        )
        _graphiql_assets(built / VENDOR)


setup(cmdclass={"build_py": BuildPy})
