"""Model folders under the configured directories, and rescans that skip what did not change."""

import os
import time
from pathlib import Path

import pytest
from fake_root import GIB, add_model

from agent.discovery.weights import Weights, WeightsScanner, folder_size

LONG_AGO = time.time() - 7 * 24 * 3600


def settle(root: Path) -> None:
    """Date every directory a week back, as on a node whose models arrived long ago."""
    for dirpath, _dirs, _files in os.walk(root):
        os.utime(dirpath, (LONG_AGO, LONG_AGO))


class CountingMeasure:
    def __init__(self) -> None:
        self.measured: list[str] = []

    def __call__(self, path: str) -> int:
        self.measured.append(path)
        return folder_size(path)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    add_model(
        tmp_path,
        "/data/models/meta-llama/Llama-3.1-8B-Instruct",
        {
            "config.json": 900,
            "model-00001-of-00004.safetensors": 5 * GIB,
            "model-00002-of-00004.safetensors": 5 * GIB,
            "model-00003-of-00004.safetensors": 5 * GIB,
            "model-00004-of-00004.safetensors": 1 * GIB,
            "tokenizer.json": 9_000_000,
        },
    )
    add_model(tmp_path, "/data/models/qwen-gguf", {"qwen2.5-7b-instruct-q4_k_m.gguf": 4 * GIB})
    add_model(tmp_path, "/data/models/old-bert", {"config.json": 500, "pytorch_model.bin": GIB})
    # Not models: a tokenizer alone, a dataset, a filer snapshot of a model.
    add_model(tmp_path, "/data/models/tokenizers/llama", {"tokenizer.json": 100})
    add_model(tmp_path, "/data/models/datasets/alpaca", {"train.jsonl": 1000})
    add_model(
        tmp_path,
        "/data/models/.snapshot/hourly.0/old-bert",
        {"config.json": 500, "pytorch_model.bin": GIB},
    )
    return tmp_path


def scan(scanner: WeightsScanner, dirs: list[str]) -> list[Weights]:
    warnings: list[str] = []
    found = scanner.scan(dirs, warnings.append)
    assert warnings == []
    return found


def test_model_folders_are_found_with_their_size(models: Path) -> None:
    found = scan(WeightsScanner(str(models)), ["/data/models"])
    assert found == [
        Weights("/data/models/meta-llama/Llama-3.1-8B-Instruct", 16 * GIB + 9_000_900),
        Weights("/data/models/old-bert", GIB + 500),
        Weights("/data/models/qwen-gguf", 4 * GIB),
    ]


def test_a_hugging_face_cache_is_read_through_its_symlinks(tmp_path: Path) -> None:
    repo = tmp_path / "data/hf/hub/models--mistralai--Mistral-7B-v0.3"
    add_model(tmp_path, str(repo.relative_to(tmp_path) / "blobs"), {"a1": 800, "b2": 14 * GIB})
    snapshot = repo / "snapshots/0d4b76e1"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/a1", snapshot / "config.json")
    os.symlink("../../blobs/b2", snapshot / "model.safetensors")

    found = scan(WeightsScanner(str(tmp_path)), ["/data/hf"])
    assert found == [
        Weights(
            "/data/hf/hub/models--mistralai--Mistral-7B-v0.3/snapshots/0d4b76e1", 14 * GIB + 800
        )
    ]


def test_a_configured_directory_that_is_itself_a_model_is_reported(models: Path) -> None:
    found = scan(WeightsScanner(str(models)), ["/data/models/old-bert"])
    assert [w.path for w in found] == ["/data/models/old-bert"]


def test_a_directory_with_no_models_gives_an_empty_list(models: Path) -> None:
    assert scan(WeightsScanner(str(models)), ["/data/models/datasets"]) == []


def test_a_rescan_of_an_unchanged_tree_measures_nothing_again(models: Path) -> None:
    settle(models)
    measure = CountingMeasure()
    scanner = WeightsScanner(str(models), measure=measure)
    first = scan(scanner, ["/data/models"])
    assert len(measure.measured) == 3

    measure.measured.clear()
    assert scan(scanner, ["/data/models"]) == first
    assert measure.measured == []


def test_a_rescan_measures_only_the_folder_that_changed_and_sees_new_and_removed_ones(
    models: Path,
) -> None:
    settle(models)
    measure = CountingMeasure()
    scanner = WeightsScanner(str(models), measure=measure)
    scan(scanner, ["/data/models"])
    measure.measured.clear()

    add_model(models, "/data/models/old-bert", {"pytorch_model-2.bin": GIB})
    add_model(models, "/data/models/mistral", {"config.json": 1, "model.safetensors": 2 * GIB})
    for name in os.listdir(models / "data/models/qwen-gguf"):
        os.remove(models / "data/models/qwen-gguf" / name)

    found = scan(scanner, ["/data/models"])
    assert found == [
        Weights("/data/models/meta-llama/Llama-3.1-8B-Instruct", 16 * GIB + 9_000_900),
        Weights("/data/models/mistral", 2 * GIB + 1),
        Weights("/data/models/old-bert", 2 * GIB + 500),
    ]
    assert sorted(os.path.basename(p) for p in measure.measured) == ["mistral", "old-bert"]


def test_a_folder_that_changed_recently_is_measured_until_it_settles(models: Path) -> None:
    # A download writing a file in place grows it without touching the folder's mtime.
    measure = CountingMeasure()
    scanner = WeightsScanner(str(models), measure=measure)
    scan(scanner, ["/data/models/qwen-gguf"])
    with open(models / "data/models/qwen-gguf/qwen2.5-7b-instruct-q4_k_m.gguf", "r+b") as f:
        f.truncate(5 * GIB)
    assert scan(scanner, ["/data/models/qwen-gguf"]) == [Weights("/data/models/qwen-gguf", 5 * GIB)]
    assert len(measure.measured) == 2


def test_an_unreadable_directory_is_skipped_with_a_warning(models: Path) -> None:
    warnings: list[str] = []
    found = WeightsScanner(str(models)).scan(["/data/models", "/data/gone"], warnings.append)
    assert len(found) == 3
    assert warnings == ["weights: cannot stat /data/gone (No such file or directory): skipped"]


def test_a_symlink_loop_is_walked_once(models: Path) -> None:
    os.symlink(models / "data/models", models / "data/models/meta-llama/loop")
    found = scan(WeightsScanner(str(models)), ["/data/models"])
    assert len(found) == 3
