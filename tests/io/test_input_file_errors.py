"""Problems with the input as a whole: one InputError (or ConfigError) with one clear message."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import ConfigError, InputError
from astrai_batch.io import open_input

NO_PROMPT = (
    "no prompt column found in {name}: expected one of prompt, messages, prompt_token_ids, "
    "custom_id+body (or pass --prompt-column); columns are: {columns}"
)


def parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def raises(error: type[Exception], message: str):
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    with raises(InputError, f"input not found: {missing}"):
        open_input(missing)
    with raises(InputError, f"input not found: {tmp_path / 'dir'}"):
        open_input(tmp_path / "dir", input_format="parquet")


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not data")
    with raises(InputError, f"no .parquet files in directory {tmp_path}"):
        open_input(tmp_path)


def test_corrupt_parquet(tmp_path: Path) -> None:
    path = tmp_path / "input.parquet"
    path.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(InputError, match=r"^cannot read Parquet file input\.parquet: "):
        open_input(path)


def test_jsonl_read_as_parquet(write_jsonl) -> None:
    path = write_jsonl("data.jsonl", [{"prompt": "a"}])
    with pytest.raises(InputError, match=r"^cannot read Parquet file data\.jsonl: "):
        open_input(path, input_format="parquet")


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("prompt\nhello\n")
    with raises(
        InputError,
        "cannot tell the input format of data.csv: name it .parquet, .jsonl, .jsonl.gz or "
        ".arrow, or pass --input-format parquet|jsonl",
    ):
        open_input(path)


def test_bad_option_values(tmp_path: Path) -> None:
    path = parquet(tmp_path / "input.parquet", {"prompt": ["a"]})
    with raises(ConfigError, "input_format must be 'parquet' or 'jsonl', got 'csv'"):
        open_input(path, input_format="csv")
    with raises(ConfigError, "keep_columns must be a sequence of column names, not one string"):
        open_input(path, keep_columns="prompt")
    with raises(ConfigError, "keep_columns lists prompt more than once"):
        open_input(path, keep_columns=["prompt", "prompt"])


def test_directory_as_jsonl(tmp_path: Path) -> None:
    with raises(InputError, f"{tmp_path} is a directory; only Parquet input can be a directory"):
        open_input(tmp_path, input_format="jsonl")


def test_no_prompt_column(tmp_path: Path, write_jsonl) -> None:
    path = parquet(tmp_path / "input.parquet", {"a": [1], "b": ["x"]})
    with raises(InputError, NO_PROMPT.format(name="input.parquet", columns="a, b")):
        open_input(path)
    path = write_jsonl("input.jsonl", [{"text": "hi", "custom_id": "c"}])
    with raises(InputError, NO_PROMPT.format(name="input.jsonl", columns="text, custom_id")):
        open_input(path)


def test_named_columns_must_exist(tmp_path: Path) -> None:
    path = parquet(tmp_path / "input.parquet", {"prompt": ["a"], "b": [1]})
    with raises(
        InputError, "prompt column 'text' not found in input.parquet; columns are: prompt, b"
    ):
        open_input(path, prompt_column="text")
    with raises(InputError, "id column 'uid' not found in input.parquet; columns are: prompt, b"):
        open_input(path, id_column="uid")
    with raises(InputError, "keep column 'c' not found in input.parquet; columns are: prompt, b"):
        open_input(path, keep_columns=["b", "c"])


def test_jsonl_without_any_object_line(write_jsonl) -> None:
    # no lines at all is an input of no rows (tests/jobs/test_empty_inputs.py); lines none
    # of which is an object tell no shape
    with raises(InputError, "no JSON object line in junk.jsonl: cannot tell the row shape"):
        open_input(write_jsonl("junk.jsonl", ["[1]", "", "oops"]))


def test_gz_name_without_gzip_content(write_jsonl) -> None:
    path = write_jsonl("input.jsonl.gz", [{"prompt": "a"}])
    with pytest.raises(InputError, match=r"^cannot read input\.jsonl\.gz: Not a gzipped file"):
        open_input(path)


def test_parquet_column_of_the_wrong_type(tmp_path: Path) -> None:
    path = parquet(tmp_path / "input.parquet", {"prompt": [1, 2]})
    with raises(InputError, "column 'prompt' in input.parquet has type int64; expected a string"):
        open_input(path)
    path = parquet(tmp_path / "tok.parquet", {"prompt_token_ids": [["a"]]})
    with raises(
        InputError,
        "column 'prompt_token_ids' in tok.parquet has type list<element: string>; "
        "expected a list of integers",
    ):
        open_input(path)
    path = parquet(tmp_path / "msg.parquet", {"messages": [[{"who": "user"}]]})
    with raises(
        InputError,
        "column 'messages' in msg.parquet has type list<element: struct<who: string>>; "
        "expected a list of {role, content} structs",
    ):
        open_input(path)
    path = parquet(tmp_path / "body.parquet", {"custom_id": ["c"], "body": [3]})
    with raises(
        InputError,
        "column 'body' in body.parquet has type int64; expected a struct or a JSON string",
    ):
        open_input(path)
    path = parquet(tmp_path / "num.parquet", {"score": [1.5]})
    with raises(
        InputError,
        "prompt column 'score' in num.parquet has type double; expected a string, "
        "a list of integers, or a list of {role, content} structs",
    ):
        open_input(path, prompt_column="score")


def test_directory_files_must_share_the_columns(tmp_path: Path) -> None:
    parquet(tmp_path / "a.parquet", {"prompt": ["x"], "tag": ["t"]})
    parquet(tmp_path / "b.parquet", {"text": ["y"], "tag": ["t"]})
    with raises(InputError, NO_PROMPT.format(name="b.parquet", columns="text, tag")):
        open_input(tmp_path)


def test_directory_files_must_agree_on_id_columns(tmp_path: Path) -> None:
    parquet(tmp_path / "a.parquet", {"prompt": ["x"], "id": ["a"]})
    parquet(tmp_path / "b.parquet", {"prompt": ["y"]})
    with raises(InputError, "b.parquet has no column 'id', which the first file a.parquet has"):
        open_input(tmp_path)
    # Ids in a later file only: the first file's rows would get numbers that could collide.
    (tmp_path / "a.parquet").unlink()
    parquet(tmp_path / "c.parquet", {"prompt": ["z"], "id": ["c"]})
    with raises(
        InputError, "c.parquet has an id column 'id', which the first file b.parquet lacks"
    ):
        open_input(tmp_path)


def test_directory_keep_column_types_must_agree(tmp_path: Path) -> None:
    parquet(tmp_path / "a.parquet", {"prompt": ["x"], "tag": ["t"]})
    parquet(tmp_path / "b.parquet", {"prompt": ["y"], "tag": [1]})
    assert open_input(tmp_path).count_rows() == 2
    with raises(
        InputError, "keep column 'tag' has type int64 in b.parquet but string in a.parquet"
    ):
        open_input(tmp_path, keep_columns=["tag"])
