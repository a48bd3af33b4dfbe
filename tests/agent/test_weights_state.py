"""Each model folder's state from the markers on disk (agent/discovery/weights_state.py), on a fake root."""

import os
import subprocess
from pathlib import Path

import pytest
from fake_root import GIB, add_model

from agent.discovery.weights import WeightsScanner
from agent.discovery.weights_state import WeightsStatus, manifest_digest
from agent.report import Report

HF_REPO = "/data/hf/hub/models--meta-llama--Llama-3.1-70B"
REVISION = "0d4b76e1efa1b2c3"


def states(root: Path, scanner: WeightsScanner, dirs: list[str]) -> dict[str, WeightsStatus]:
    warnings: list[str] = []
    found = scanner.scan(dirs, warnings.append)
    judged = scanner.judge.judge_all(
        [(w.path, str(root / w.path.lstrip("/")), w.size_bytes) for w in found], warnings.append
    )
    return {w.path: status for w, status in zip(found, judged, strict=True)}


def hf_snapshot(root: Path, blobs: dict[str, int], *, ref: bool) -> Path:
    """A hub cache snapshot whose files are symlinks into blobs/; `ref`: refs/main names it."""
    repo = root / HF_REPO.lstrip("/")
    add_model(root, f"{HF_REPO}/blobs", blobs)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/cfg", snapshot / "config.json")
    os.symlink("../../blobs/w1", snapshot / "model.safetensors")
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs/main").write_text(REVISION)
    return snapshot


def test_a_completed_hugging_face_snapshot_is_ready_with_its_revision(tmp_path: Path) -> None:
    snapshot = hf_snapshot(tmp_path, {"cfg": 800, "w1": 14 * GIB}, ref=True)
    found = states(tmp_path, WeightsScanner(str(tmp_path)), ["/data/hf"])
    path = f"{HF_REPO}/snapshots/{REVISION}"
    assert found == {
        path: WeightsStatus(
            "READY", REVISION, 14 * GIB + 800, manifest_digest(str(snapshot)).digest
        )
    }


def test_a_snapshot_whose_ref_is_not_written_yet_is_downloading(tmp_path: Path) -> None:
    hf_snapshot(tmp_path, {"cfg": 800, "w1": 14 * GIB, "w2.incomplete": GIB}, ref=True)
    found = states(tmp_path, WeightsScanner(str(tmp_path)), ["/data/hf"])
    assert [s.state for s in found.values()] == ["DOWNLOADING"]
    # No refs/ at all: the hub has not finished either.
    other = tmp_path / "other"
    hf_snapshot(other, {"cfg": 800, "w1": 14 * GIB}, ref=False)
    found = states(other, WeightsScanner(str(other)), ["/data/hf"])
    assert [(s.state, s.revision) for s in found.values()] == [("DOWNLOADING", REVISION)]


def test_a_growing_file_is_downloading_until_it_stops_growing(tmp_path: Path) -> None:
    folder = add_model(tmp_path, "/data/models/qwen", {"config.json": 10, "model.safetensors": GIB})
    (folder / ".complete").write_text(manifest_digest(str(folder)).digest)
    scanner = WeightsScanner(str(tmp_path))
    assert states(tmp_path, scanner, ["/data/models"])["/data/models/qwen"].state == "READY"

    # A new download writes the file in place: it grows between two scans.
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(2 * GIB)
    assert states(tmp_path, scanner, ["/data/models"])["/data/models/qwen"].state == "DOWNLOADING"
    # It stopped growing, but the files no longer match the marker.
    assert states(tmp_path, scanner, ["/data/models"])["/data/models/qwen"].state == "FAILED"
    # The download tool writes the new marker: ready again.
    (folder / ".complete").write_text(manifest_digest(str(folder)).digest)
    assert states(tmp_path, scanner, ["/data/models"])["/data/models/qwen"].state == "READY"


def test_a_downloading_marker_gives_the_expected_total(tmp_path: Path) -> None:
    folder = add_model(tmp_path, "/data/models/llama", {"config.json": 10, "a.safetensors": GIB})
    (folder / ".downloading").write_text(str(140 * 10**9))
    [status] = states(tmp_path, WeightsScanner(str(tmp_path)), ["/data/models"]).values()
    assert status == WeightsStatus("DOWNLOADING", None, 140 * 10**9)
    # A total below what is already there is wrong, and left out rather than refused.
    (folder / ".downloading").write_text("5")
    [status] = states(tmp_path, WeightsScanner(str(tmp_path)), ["/data/models"]).values()
    assert status == WeightsStatus("DOWNLOADING")


def test_a_marker_with_the_wrong_digest_is_failed_with_a_warning(tmp_path: Path) -> None:
    folder = add_model(tmp_path, "/data/models/bert", {"config.json": 10, "model.bin": GIB})
    (folder / ".complete").write_text("sha256:" + "0" * 64)
    warnings: list[str] = []
    scanner = WeightsScanner(str(tmp_path))
    found = scanner.scan(["/data/models"], warnings.append)
    [status] = scanner.judge.judge_all(
        [(w.path, str(folder), w.size_bytes) for w in found], warnings.append
    )
    actual = manifest_digest(str(folder)).digest
    assert status == WeightsStatus("FAILED", None, None, actual)
    assert warnings == [
        f"weights: /data/models/bert: .complete says sha256:{'0' * 64}, the files are {actual}: "
        "FAILED"
    ]


def test_an_eviction_marker_wins_and_a_plain_folder_has_no_state(tmp_path: Path) -> None:
    evicted = add_model(tmp_path, "/data/models/old", {"config.json": 10, "model.bin": GIB})
    (evicted / ".complete").write_text(manifest_digest(str(evicted)).digest)
    (evicted / ".evicting").write_text("")
    add_model(tmp_path, "/data/models/plain", {"config.json": 10, "model.bin": GIB})
    found = states(tmp_path, WeightsScanner(str(tmp_path)), ["/data/models"])
    assert {p: s.state for p, s in found.items()} == {
        "/data/models/old": "EVICTING",
        "/data/models/plain": None,
    }


def test_the_manifest_digest_follows_names_and_sizes_not_markers(tmp_path: Path) -> None:
    folder = add_model(tmp_path, "/m", {"config.json": 10, "model.bin": GIB})
    before = manifest_digest(str(folder)).digest
    (folder / ".complete").write_text(before)
    assert manifest_digest(str(folder)).digest == before
    os.truncate(folder / "model.bin", GIB - 1)
    assert manifest_digest(str(folder)).digest != before


def test_unchanged_weights_seen_again_add_nothing_to_a_heartbeat() -> None:
    def report(observed_at: str) -> Report:
        weights = [{"path": "/m", "sizeBytes": 1, "state": "READY", "observedAt": observed_at}]
        return Report({"id": "gpu-01", "weights": weights})

    first = report("2026-12-05T08:00:00+00:00")
    later = report("2026-12-05T08:01:00+00:00")
    assert not later.changed_since(first)  # the loop sends a heartbeat, not the report
    moved = Report({"id": "gpu-01", "weights": [{"path": "/m", "sizeBytes": 1}]})
    assert moved.changed_since(first)


@pytest.mark.process
def test_the_marker_command_in_the_docs_writes_the_digest_the_agent_checks(tmp_path: Path) -> None:
    # docs/scheduler/weights.md tells download tools to write .complete with this command.
    folder = add_model(tmp_path, "/m", {"config.json": 10, "a.safetensors": 3000, "sub/t.json": 5})
    command = (
        "find -L . -type f ! -name .complete ! -name .evicting ! -name .downloading "
        "-printf '%P\\t%s\\n' | LC_ALL=C sort | sha256sum | sed 's/^/sha256:/; s/ .*//' "
        "> .complete"
    )
    subprocess.run(["bash", "-c", command], cwd=folder, check=True)
    assert (folder / ".complete").read_text().strip() == manifest_digest(str(folder)).digest
