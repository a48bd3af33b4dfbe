"""Settings come from the environment; docs/operations/configuration.md documents each with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.config import SETTINGS, SettingError, Settings, deprecation_warnings

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


def test_the_fast_paths_old_switch_is_still_read_until_the_new_one_is_set() -> None:
    """INVENTORY_DIRECT_EXECUTION, deprecated: read as INVENTORY_FAST_PATH while that is unset."""
    assert Settings.from_env({"INVENTORY_DIRECT_EXECUTION": "false"}).fast_path is False
    assert Settings.from_env({"INVENTORY_FAST_PATH": "false"}).fast_path is False
    both = {"INVENTORY_DIRECT_EXECUTION": "false", "INVENTORY_FAST_PATH": "true"}
    assert Settings.from_env(both).fast_path is True
    # A bad value names the variable it was read from.
    with pytest.raises(SettingError, match=r"INVENTORY_DIRECT_EXECUTION='maybe'"):
        Settings.from_env({"INVENTORY_DIRECT_EXECUTION": "maybe"})


def test_a_deprecated_name_is_one_warning_line_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from service import cli

    assert deprecation_warnings({"INVENTORY_FAST_PATH": "false"}) == []
    assert deprecation_warnings({"INVENTORY_DIRECT_EXECUTION": "false"}) == [
        "INVENTORY_DIRECT_EXECUTION is deprecated: set INVENTORY_FAST_PATH instead "
        "(read as INVENTORY_FAST_PATH for now)"
    ]
    (ignored,) = deprecation_warnings(
        {"INVENTORY_DIRECT_EXECUTION": "false", "INVENTORY_FAST_PATH": "true"}
    )
    assert "ignored" in ignored

    # The command logs it once logging is set up (kept as the test's own here).
    monkeypatch.setattr(cli, "configure_logging", lambda settings: None)
    monkeypatch.setenv("INVENTORY_DIRECT_EXECUTION", "false")
    monkeypatch.delenv("INVENTORY_FAST_PATH", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with caplog.at_level("WARNING"):
        assert cli.main(["reset", "--data-dir", str(tmp_path / "none")]) == 0
    warned = [r.getMessage() for r in caplog.records if "DIRECT_EXECUTION" in r.getMessage()]
    assert warned == [deprecation_warnings({"INVENTORY_DIRECT_EXECUTION": "false"})[0]]
