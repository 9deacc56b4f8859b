"""hf://datasets/... inputs read from the local hub cache, offline (there is no network here;
`HfFileSystem` has no offline mode, so the cache is what an offline run reads)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_layouts import DEFAULT_COMMIT, parquet_bytes, write_hub_dataset
from huggingface_hub import constants, scan_cache_dir

from astrai_batch.errors import InputError
from astrai_batch.io import open_input
from astrai_batch.io.filesystems import resolve
from astrai_batch.io.hub_datasets import split_of

REPO = "org/name"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding org/name: two train shards (row groups of 2), a test split, a
    README; and offline mode on."""
    cache = tmp_path / "hub"
    files = {
        "README.md": b"# org/name\n",
        "data/train-00000-of-00002.parquet": parquet_bytes(
            {"id": ["t0", "t1", "t2"], "prompt": ["a", "b", "c"]}, row_group_size=2
        ),
        "data/train-00001-of-00002.parquet": parquet_bytes(
            {"id": ["t3", "t4"], "prompt": ["d", "e"]}, row_group_size=2
        ),
        "data/test-00000-of-00001.parquet": parquet_bytes({"id": ["s0"], "prompt": ["z"]}),
    }
    write_hub_dataset(cache, REPO, files)
    write_hub_dataset(
        cache,
        REPO,
        {"data/train-00000-of-00001.parquet": parquet_bytes({"id": ["v0"], "prompt": ["old"]})},
        commit="f" * 40,
        ref="v1.0",
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def prompts(uri: str) -> list[str]:
    return [row.prompt for row in open_input(uri).iter_rows()]


def test_the_fake_cache_is_what_huggingface_hub_reads(hub_cache: Path) -> None:
    (repo,) = scan_cache_dir(hub_cache).repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "dataset")
    revisions = {revision.commit_hash: revision for revision in repo.revisions}
    assert revisions[DEFAULT_COMMIT].refs == frozenset({"main"})
    assert revisions["f" * 40].refs == frozenset({"v1.0"})
    assert sorted(f.file_name for f in revisions[DEFAULT_COMMIT].files) == [
        "README.md",
        "test-00000-of-00001.parquet",
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]


def test_files_globs_and_revisions_read_from_the_cache(hub_cache: Path) -> None:
    assert prompts("hf://datasets/org/name/data/train-*.parquet") == list("abcde")
    assert prompts("hf://datasets/org/name/data/test-00000-of-00001.parquet") == ["z"]
    assert prompts("hf://datasets/org/name/**/*.parquet") == ["z", *"abcde"]
    assert prompts("hf://datasets/org/name@v1.0/data/train-*.parquet") == ["old"]
    assert prompts(f"hf://datasets/org/name@{'f' * 40}") == ["old"]  # one split: the repo
    source = open_input("hf://datasets/org/name@main/data/train-*.parquet")
    assert source.path.shown == "hf://datasets/org/name@main/data/train-*.parquet"
    assert [file.name for file in source.files] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    assert source.fingerprint()["format"] == "parquet"


def test_every_range_reads_exactly_its_rows(hub_cache: Path) -> None:
    source = open_input("hf://datasets/org/name/data/train-*.parquet")
    rows = [(row.index, row.id, row.prompt) for row in source.iter_rows()]
    assert [row[1] for row in rows] == ["t0", "t1", "t2", "t3", "t4"]
    for start in range(6):
        for stop in range(start, 7):
            got = [(row.index, row.id, row.prompt) for row in source.iter_rows(start, stop)]
            assert got == rows[start:stop], (start, stop)


def test_a_repository_of_several_splits_is_refused_naming_each(hub_cache: Path) -> None:
    with pytest.raises(InputError) as refused:
        open_input("hf://datasets/org/name")
    assert str(refused.value) == (
        "hf://datasets/org/name holds the splits train, test: name one, as a file or a glob "
        "(train: hf://datasets/org/name/data/train-*.parquet, "
        "test: hf://datasets/org/name/data/test-00000-of-00001.parquet)"
    )


def test_what_is_not_in_the_cache_says_so_and_how_to_download_it(hub_cache: Path) -> None:
    with pytest.raises(InputError) as missing:
        resolve("hf://datasets/org/other/data.parquet")
    assert str(missing.value) == (
        f"dataset org/other is not in the local Hugging Face cache ({hub_cache}) and "
        "HF_HUB_OFFLINE is set: download it where the hub is reachable with "
        "`hf download org/other --repo-type dataset` (or point HF_HUB_CACHE at a cache that "
        "holds it)"
    )
    with pytest.raises(InputError, match=r"^dataset org/name at revision v2 is not in the "):
        resolve("hf://datasets/org/name@v2")
    with pytest.raises(InputError) as no_file:
        open_input("hf://datasets/org/name/data/valid.parquet")
    assert str(no_file.value) == "input not found: hf://datasets/org/name/data/valid.parquet"
    with pytest.raises(InputError) as no_match:
        open_input("hf://datasets/org/name/data/valid-*.parquet")
    assert str(no_match.value) == "no files match hf://datasets/org/name/data/valid-*.parquet"


def test_an_unreachable_hub_falls_back_to_the_cache(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    assert prompts("hf://datasets/org/name/data/train-*.parquet") == list("abcde")
    with pytest.raises(InputError, match=r"and the hub cannot be reached \(\w+\): download it"):
        resolve("hf://datasets/org/other")


def test_uris_that_are_not_datasets_are_refused_in_the_users_terms(hub_cache: Path) -> None:
    with pytest.raises(InputError) as model:
        resolve("hf://org/some-model")
    assert str(model.value) == (
        "hf://org/some-model names a model repository; an input is a dataset: "
        "hf://datasets/ORG/NAME[@REVISION][/PATH]"
    )
    with pytest.raises(InputError) as bad:
        resolve("hf://datasets/justaname")
    assert str(bad.value) == (
        "cannot read hf://datasets/justaname: expected hf://datasets/ORG/NAME[@REVISION][/PATH]"
    )


@pytest.mark.parametrize(
    ("relative", "split"),
    [
        ("data/train-00000-of-00002.parquet", "train"),
        ("data/validation-00000-of-00001.parquet", "validation"),
        ("default/test/0000.parquet", "test"),
        ("default/train/0000.parquet", "train"),
        ("dev.parquet", "validation"),
        ("eval_v2.parquet", "test"),
        ("my_data.parquet", "train"),
        ("testimonials.parquet", "train"),  # a keyword inside a word is not a split
    ],
)
def test_splits_are_found_by_datasets_keywords(relative: str, split: str) -> None:
    assert split_of(relative) == split
