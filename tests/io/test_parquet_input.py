from __future__ import annotations

import inspect
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astrai_batch.errors import InputError
from astrai_batch.io import InputRow, open_input

MESSAGE_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def write(path: Path, columns: dict, schema: pa.Schema | None = None, **kwargs) -> Path:
    pq.write_table(pa.table(columns, schema=schema), path, **kwargs)
    return path


def test_prompt_rows(tmp_path: Path) -> None:
    source = open_input(write(tmp_path / "in.parquet", {"prompt": ["Hello", "World"]}))
    assert source.shape == "prompt"
    assert source.format == "parquet"
    assert source.columns() == ["prompt"]
    assert source.count_rows() == 2
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="0", prompt="Hello"),
        InputRow(index=1, id="1", prompt="World"),
    ]


def test_messages_rows(tmp_path: Path) -> None:
    messages = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Bye"}],
    ]
    path = write(
        tmp_path / "in.parquet",
        {"messages": messages},
        schema=pa.schema([("messages", MESSAGE_TYPE)]),
    )
    source = open_input(path)
    assert source.shape == "messages"
    rows = list(source.iter_rows())
    assert rows == [
        InputRow(
            index=0,
            id="0",
            messages=(
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ),
        ),
        InputRow(index=1, id="1", messages=({"role": "user", "content": "Bye"},)),
    ]
    assert rows[0].kind == "chat"


def test_token_id_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "in.parquet", {"prompt_token_ids": [[1, 2, 3], [0]]})
    source = open_input(path)
    assert source.shape == "prompt_token_ids"
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="0", prompt_token_ids=(1, 2, 3)),
        InputRow(index=1, id="1", prompt_token_ids=(0,)),
    ]


def test_each_row_has_its_own_shape_messages_over_token_ids_over_prompt(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.parquet",
        {
            "prompt": ["p", "p", "p", None],
            "prompt_token_ids": [[5], None, [6], None],
            "messages": [[{"role": "user", "content": "m"}], None, None, None],
        },
    )
    source = open_input(path)
    assert source.shape == "mixed"
    assert list(source.iter_rows()) == [
        InputRow(index=0, id="0", messages=({"role": "user", "content": "m"},)),
        InputRow(index=1, id="1", prompt="p"),  # a null messages beside a prompt
        InputRow(index=2, id="2", prompt_token_ids=(6,)),
        InputRow(index=3, id="3", error="messages is missing"),
    ]
    path = write(tmp_path / "in2.parquet", {"prompt": ["p"], "prompt_token_ids": [[5]]})
    assert [row.prompt_token_ids for row in open_input(path).iter_rows()] == [(5,)]


def test_ids_from_id_custom_id_id_column_and_row_number(tmp_path: Path) -> None:
    path = write(tmp_path / "ids.parquet", {"prompt": ["a", "b"], "id": [7, None]})
    assert list(open_input(path).iter_rows()) == [
        InputRow(index=0, id="7", prompt="a"),
        InputRow(index=1, id=None, error="id is missing"),
    ]

    path = write(tmp_path / "cid.parquet", {"prompt": ["a", "b"], "custom_id": ["x", "y"]})
    assert [row.id for row in open_input(path).iter_rows()] == ["x", "y"]

    path = write(
        tmp_path / "both.parquet", {"prompt": ["a"], "id": ["from-id"], "custom_id": ["c"]}
    )
    assert [row.id for row in open_input(path).iter_rows()] == ["from-id"]

    path = write(tmp_path / "col.parquet", {"prompt": ["a"], "id": ["no"], "uid": [3.5]})
    assert [row.id for row in open_input(path, id_column="uid").iter_rows()] == ["3.5"]

    path = write(tmp_path / "none.parquet", {"prompt": ["a", "b"]})
    assert [row.id for row in open_input(path).iter_rows()] == ["0", "1"]


def test_overrides_are_picked_up_and_nulls_skipped(tmp_path: Path) -> None:
    columns = {
        "prompt": ["a", "b"],
        "max_tokens": [16, None],
        "min_tokens": [2, None],
        "temperature": [0.5, None],
        "top_p": [0.9, None],
        "top_k": [40, None],
        "min_p": [0.05, None],
        "seed": [11, None],
        "stop": [["\n", "END"], None],
        "n": [3, None],
        "presence_penalty": [0.25, None],
        "frequency_penalty": [-0.5, None],
        "repetition_penalty": [1.125, None],
        "logprobs": [True, None],
        "unrelated": [1, 2],
    }
    first, second = open_input(write(tmp_path / "in.parquet", columns)).iter_rows()
    assert first.overrides == {
        "max_tokens": 16,
        "min_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 11,
        "stop": ["\n", "END"],
        "n": 3,
        "presence_penalty": 0.25,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.125,
        "logprobs": True,
    }
    assert second.overrides == {}


def test_keep_columns_keep_their_values_and_types(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.parquet",
        {"prompt": ["a", "b"], "score": [1, None], "tags": [["x"], ["y", "z"]]},
    )
    source = open_input(path, keep_columns=["tags", "score"])
    assert source.kept_schema() == pa.schema(
        [("tags", pa.list_(pa.string())), ("score", pa.int64())]
    )
    assert [row.kept for row in source.iter_rows()] == [
        {"tags": ["x"], "score": 1},
        {"tags": ["y", "z"], "score": None},
    ]


def test_prompt_column_picks_the_shape_from_its_type(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.parquet",
        {
            "prompt": ["ignored"],
            "text": ["Hello"],
            "chat": [[{"role": "user", "content": "Hi"}]],
            "tokens": [[4, 5]],
        },
    )
    assert list(open_input(path, prompt_column="text").iter_rows()) == [
        InputRow(index=0, id="0", prompt="Hello")
    ]
    chat = open_input(path, prompt_column="chat")
    assert chat.shape == "messages"
    assert next(chat.iter_rows()).messages == ({"role": "user", "content": "Hi"},)
    tokens = open_input(path, prompt_column="tokens")
    assert tokens.shape == "prompt_token_ids"
    assert next(tokens.iter_rows()).prompt_token_ids == (4, 5)


def test_directory_of_files_is_read_in_name_order_as_one_input(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write(data / "part-2.parquet", {"id": ["c0", "c1"], "prompt": ["C0", "C1"]})
    write(data / "part-0.parquet", {"id": ["a0"], "prompt": ["A0"], "extra": [1]})
    write(data / "part-1.parquet", {"prompt": ["B0", "B1", "B2"], "id": ["b0", "b1", "b2"]})
    (data / "_SUCCESS").write_text("")
    write(data / ".hidden.parquet", {"prompt": ["never"]})
    source = open_input(data)
    assert source.format == "parquet"
    assert [path.name for path in source.files] == [
        "part-0.parquet",
        "part-1.parquet",
        "part-2.parquet",
    ]
    assert source.count_rows() == 6
    rows = list(source.iter_rows())
    assert [(row.index, row.id, row.prompt) for row in rows] == [
        (0, "a0", "A0"),
        (1, "b0", "B0"),
        (2, "b1", "B1"),
        (3, "b2", "B2"),
        (4, "c0", "C0"),
        (5, "c1", "C1"),
    ]
    for start in range(8):
        assert list(source.iter_rows(start)) == rows[start:]


def test_start_equals_the_tail_across_row_groups_and_batches(tmp_path: Path) -> None:
    # Row groups of 2500 rows are read in batches of 1024, so starts land in the first
    # batch, a later batch, exactly on batch and group borders, and past the end.
    count = 5000
    path = write(
        tmp_path / "big.parquet",
        {"prompt": [f"p{i}" for i in range(count)], "seed": list(range(count))},
        row_group_size=2500,
    )
    source = open_input(path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    assert source.count_rows() == count
    rows = list(source.iter_rows())
    assert [row.index for row in rows] == list(range(count))
    assert rows[4321] == InputRow(index=4321, id="4321", prompt="p4321", overrides={"seed": 4321})
    for start in (0, 1, 1023, 1024, 1025, 2000, 2499, 2500, 2501, 4999, 5000, 6000):
        assert list(source.iter_rows(start)) == rows[start:]


def test_iter_rows_is_a_lazy_generator_and_rejects_negative_start(tmp_path: Path) -> None:
    source = open_input(write(tmp_path / "in.parquet", {"prompt": ["a"]}))
    assert inspect.isgenerator(source.iter_rows())
    with pytest.raises(ValueError, match=r"^start must be >= 0, got -1$"):
        source.iter_rows(-1)


def test_empty_parquet_file_has_no_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.parquet", {"prompt": []}, schema=pa.schema([("prompt", pa.string())])
    )
    source = open_input(path)
    assert source.count_rows() == 0
    assert list(source.iter_rows()) == []


def test_input_format_override_reads_parquet_with_any_name(tmp_path: Path) -> None:
    path = write(tmp_path / "prompts.data", {"prompt": ["x"]})
    source = open_input(path, input_format="parquet")
    assert list(source.iter_rows()) == [InputRow(index=0, id="0", prompt="x")]


def test_openai_rows_from_parquet_with_struct_and_json_text_bodies(tmp_path: Path) -> None:
    body_type = pa.struct(
        [
            ("model", pa.string()),
            ("messages", MESSAGE_TYPE),
            ("max_tokens", pa.int64()),
            ("tools", pa.list_(pa.string())),
        ]
    )
    path = write(
        tmp_path / "struct.parquet",
        {
            "custom_id": ["r1"],
            "method": ["POST"],
            "url": ["/v1/chat/completions"],
            "body": [
                {
                    "model": "m",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 8,
                    "tools": None,
                }
            ],
        },
        schema=pa.schema(
            [
                ("custom_id", pa.string()),
                ("method", pa.string()),
                ("url", pa.string()),
                ("body", body_type),
            ]
        ),
    )
    source = open_input(path)
    assert source.shape == "openai"
    assert list(source.iter_rows()) == [
        InputRow(
            index=0,
            id="r1",
            messages=({"role": "user", "content": "Hi"},),
            overrides={"max_tokens": 8},
            custom_id="r1",
            model="m",  # body.model: a job runs the line with the adapter of that name
        )
    ]
    path = write(
        tmp_path / "text.parquet",
        {"custom_id": ["r2", "r3"], "body": ['{"prompt": "Once", "seed": 1}', "{oops"]},
    )
    assert list(open_input(path).iter_rows()) == [
        InputRow(index=0, id="r2", prompt="Once", overrides={"seed": 1}, custom_id="r2"),
        InputRow(
            index=1,
            id="r3",
            error="body is not valid JSON: Expecting property name enclosed in double quotes "
            "at column 2",
            custom_id="r3",
        ),
    ]


def test_fingerprint_names_every_file_with_size_and_sample_hash(tmp_path: Path) -> None:
    path = write(tmp_path / "in.parquet", {"prompt": ["a"]})
    fingerprint = open_input(path).fingerprint()
    assert fingerprint["format"] == "parquet"
    [entry] = fingerprint["files"]
    assert entry["path"] == str(path.resolve())
    assert entry["size"] == path.stat().st_size
    assert len(entry["sample_sha256"]) == 64
    assert "mtime_ns" not in entry  # content, not time, identifies an input
    assert open_input(path).fingerprint() == fingerprint


def test_dictionary_encoded_prompt_column(tmp_path: Path) -> None:
    prompts = pa.array(["a", "b", "a"]).dictionary_encode()
    path = write(tmp_path / "in.parquet", {"prompt": prompts})
    assert pa.types.is_dictionary(pq.read_schema(path).field("prompt").type)
    assert [row.prompt for row in open_input(path).iter_rows()] == ["a", "b", "a"]


def test_corrupt_row_group_fails_after_streaming_the_rows_before_it(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.parquet",
        {"prompt": [f"prompt number {i} " * 5 for i in range(4000)]},
        row_group_size=2000,
        compression="zstd",
    )
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset + 40
    data[start : start + 200] = b"\xab" * 200
    path.write_bytes(bytes(data))
    source = open_input(path)  # the footer is intact
    rows = []
    with pytest.raises(InputError, match=r"^cannot read Parquet file in\.parquet: "):
        rows.extend(source.iter_rows())
    # Rows of the intact first row group were yielded before the damage was reached; how
    # many exactly depends on pyarrow's read-ahead, never on the damaged group.
    assert 0 < len(rows) <= 2000
    assert [row.index for row in rows] == list(range(len(rows)))
