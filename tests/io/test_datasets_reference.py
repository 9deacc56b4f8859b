"""Against the real `datasets` library (skipped where it is not installed; scripts/test-long
runs this file with lm-eval's packages, `datasets` among them, on the path): what it writes
reads here row for row as `datasets` reads it, what tests/hf_layouts.py writes loads in
`datasets`, and a repository's files fall into the splits `datasets` gives them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hf_layouts import write_saved_dataset

from astrai_batch.errors import InputError
from astrai_batch.io import open_input
from astrai_batch.io.hub_datasets import split_of

datasets = pytest.importorskip("datasets")

ROWS = 2100  # more than one of datasets' 1,000-row record batches


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def records(count: int = ROWS) -> dict[str, list]:
    return {
        "id": [f"r{i}" for i in range(count)],
        "messages": [
            [{"role": "user", "content": f"question {i}"}] if i % 3 else None for i in range(count)
        ],
        "prompt": [None if i % 3 else f"prompt {i}" for i in range(count)],
    }


def ours(path, **options) -> list[tuple]:
    source = open_input(path, **options)
    return [
        (row.id, row.prompt, [dict(m) for m in row.messages] if row.messages else None)
        for row in source.iter_rows()
    ]


def theirs(dataset) -> list[tuple]:
    return [(r["id"], r["prompt"], r["messages"]) for r in dataset]


def test_save_to_disk_reads_as_load_from_disk_reads_it(tmp_path: Path) -> None:
    dataset = datasets.Dataset.from_dict(records())
    dataset.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    reference = theirs(datasets.load_from_disk(str(tmp_path / "saved")))
    assert ours(tmp_path / "saved") == reference
    source = open_input(tmp_path / "saved")
    assert [row.id for row in source.iter_rows(999, 1002)] == ["r999", "r1000", "r1001"]


def test_a_dataset_dict_and_a_download_cache(tmp_path: Path) -> None:
    full = datasets.Dataset.from_dict(records(50))
    datasets.DatasetDict({"train": full, "test": full.select(range(5))}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(InputError, match=r"is a saved DatasetDict with the splits train, test"):
        open_input(tmp_path / "dd")
    assert ours(tmp_path / "dd" / "test") == theirs(full.select(range(5)))

    jsonl = tmp_path / "rows.jsonl"
    full.to_json(str(jsonl))
    loaded = datasets.load_dataset(
        "json", data_files={"train": str(jsonl)}, cache_dir=str(tmp_path / "cache")
    )["train"]
    cache_dir = Path(loaded.cache_files[0]["filename"]).parent
    assert ours(cache_dir) == theirs(loaded)


def test_the_layout_written_by_pyarrow_loads_in_datasets(tmp_path: Path) -> None:
    data = pa.table({"id": ["a", "b", "c", "d", "e"], "prompt": list("vwxyz")})
    saved = write_saved_dataset(tmp_path / "saved", data, shards=2, batch_rows=2)
    loaded = datasets.load_from_disk(str(saved))
    assert loaded.to_dict() == data.to_pydict()
    assert [Path(f["filename"]).name for f in loaded.cache_files] == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]


def test_splits_are_the_ones_datasets_finds(tmp_path: Path) -> None:
    from datasets.data_files import get_data_patterns, resolve_pattern

    names = [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
        "data/validation-00000-of-00001.parquet",
        "data/test-00000-of-00001.parquet",
    ]
    layouts = [
        names,
        ["default/train/0000.parquet", "default/test/0000.parquet"],
        ["train.parquet", "dev.parquet", "eval.parquet"],
        ["my_train_set.parquet", "my_test_set.parquet"],
        ["one.parquet", "two.parquet"],
    ]
    for number, layout in enumerate(layouts):
        root = tmp_path / f"repo{number}"
        for name in layout:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(b"")
        expected = {}
        for split, patterns in get_data_patterns(str(root)).items():
            for pattern in patterns:
                try:
                    found = resolve_pattern(pattern, str(root))
                except FileNotFoundError:  # a split's pattern that matches nothing here
                    continue
                for path in found:
                    expected[Path(path).relative_to(root).as_posix()] = split
        assert {name: split_of(name) for name in layout} == expected, layout
