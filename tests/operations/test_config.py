"""Settings come from the environment; docs/operations/configuration.md documents each with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.config import SETTINGS, SettingError, Settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations" / "configuration.md"


def test_the_docs_list_every_setting_with_its_default() -> None:
    text = DOCS.read_text()
    table = text[text.index("<!-- settings:start -->") : text.index("<!-- settings:end -->")]
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", table, flags=re.M))
    for setting in SETTINGS:
        assert setting.env in documented, f"{setting.env} is missing from {DOCS.name}"
        shown = documented[setting.env].strip()
        assert shown == (f"`{setting.default}`" if setting.default else "(unset)"), setting.env


def test_defaults_parse_to_the_dataclass_defaults() -> None:
    from_table = Settings.from_env({s.env: s.default for s in SETTINGS if s.default})
    assert from_table == Settings()


def test_a_bad_value_names_the_variable_and_the_value() -> None:
    with pytest.raises(SettingError, match=r"INVENTORY_PORT='eighty'"):
        Settings.from_env({"INVENTORY_PORT": "eighty"})
    with pytest.raises(SettingError, match=r"INVENTORY_SWEEP_INTERVAL='-1'"):
        Settings.from_env({"INVENTORY_SWEEP_INTERVAL": "-1"})


def test_fractional_seconds_are_accepted_for_short_test_timeouts() -> None:
    settings = Settings.from_env(
        {"INVENTORY_UNREACHABLE_AFTER": "0.5", "INVENTORY_LOST_AFTER": "1.5"}
    )
    assert (settings.unreachable_after, settings.lost_after) == (0.5, 1.5)


def test_lost_must_come_after_unreachable() -> None:
    with pytest.raises(SettingError, match="INVENTORY_LOST_AFTER"):
        Settings.from_env({"INVENTORY_UNREACHABLE_AFTER": "60", "INVENTORY_LOST_AFTER": "30"})
