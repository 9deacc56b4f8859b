"""Chat template variables: job-wide (--chat-template-kwargs) and per row, merged."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs.jobkit import engine_args, listing, read_rows, run_cli, write_jsonl
from transformers import AutoTokenizer

from astrai_batch.errors import ConfigError
from astrai_batch.io import InputRow
from astrai_batch.jobs.options.config import JobConfig
from astrai_batch.jobs.options.config_file import load_toml_options
from astrai_batch.jobs.planning.tokenize import Encoding, PromptEncoder

# Prints a variable, so what reached the template shows in the prompt.
STYLE_TEMPLATE = (
    "{{ style | default('plain') }}:{% for m in messages %} {{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} =>{% endif %}"
)
HI = ({"role": "user", "content": "Hi"},)


@pytest.fixture
def style_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = STYLE_TEMPLATE
    return tokenizer


def ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_row_variables_merge_over_the_job_ones(style_tokenizer) -> None:
    rows = [
        InputRow(index=0, id="a", messages=HI),
        InputRow(index=1, id="b", messages=HI, chat_template_kwargs={"style": "loud"}),
        InputRow(index=2, id="c", messages=HI, chat_template_kwargs={"other": 1}),
    ]
    plain = PromptEncoder(style_tokenizer, "tiny").encode(rows)
    assert plain == [
        Encoding(token_ids=ids(style_tokenizer, "plain: Hi =>")),
        Encoding(token_ids=ids(style_tokenizer, "loud: Hi =>")),
        Encoding(token_ids=ids(style_tokenizer, "plain: Hi =>")),
    ]
    job = PromptEncoder(style_tokenizer, "tiny", chat_template_kwargs={"style": "terse"})
    assert job.encode(rows) == [
        Encoding(token_ids=ids(style_tokenizer, "terse: Hi =>")),
        Encoding(token_ids=ids(style_tokenizer, "loud: Hi =>")),
        Encoding(token_ids=ids(style_tokenizer, "terse: Hi =>")),
    ]


def test_names_of_the_template_call_itself_are_refused(style_tokenizer) -> None:
    row = InputRow(index=0, id="a", messages=HI, chat_template_kwargs={"tokenize": True})
    assert PromptEncoder(style_tokenizer, "tiny").encode([row]) == [
        Encoding(
            error="chat_template_kwargs cannot set 'tokenize': an argument of the chat "
            "template call"
        )
    ]
    with pytest.raises(ConfigError) as raised:
        PromptEncoder(
            style_tokenizer, "tiny", chat_template_kwargs={"tools": [], "add_generation_prompt": 0}
        )
    assert str(raised.value) == (
        "--chat-template-kwargs cannot set 'add_generation_prompt', 'tools': an argument of the "
        "chat template call"
    )


def test_job_option_parses_json_and_is_part_of_the_job_identity(tmp_path: Path) -> None:
    config = JobConfig.from_options({"chat_template_kwargs": '{"enable_thinking": false}'})
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.result_options()["chat_template_kwargs"] == {"enable_thinking": False}
    assert JobConfig().result_options()["chat_template_kwargs"] is None
    toml = tmp_path / "job.toml"
    toml.write_text("chat-template-kwargs = { enable_thinking = false }\n")
    assert JobConfig.from_options(load_toml_options(toml)) == config
    for value, message in [
        (
            "{nope",
            "chat_template_kwargs is not valid JSON: Expecting property name enclosed in "
            "double quotes at column 2",
        ),
        ("[1]", "chat_template_kwargs must be an object, got list"),
    ]:
        with pytest.raises(ConfigError) as raised:
            JobConfig.from_options({"chat_template_kwargs": value})
        assert str(raised.value) == message


def test_run_renders_rows_with_job_and_row_variables(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "style-model"
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tokenizer.chat_template = STYLE_TEMPLATE
    shutil.copytree(tiny_llama_dir, model)
    tokenizer.save_pretrained(model)
    messages = [{"role": "user", "content": "Hi"}]
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": "job", "messages": messages},
            {"id": "row", "messages": messages, "chat_template_kwargs": {"style": "very loud"}},
            {"id": "null", "messages": messages, "chat_template_kwargs": {"style": None}},
            {"id": "bad", "messages": messages, "chat_template_kwargs": {"tokenize": True}},
        ],
    )
    out = tmp_path / "out"
    out.mkdir()
    output = out / "out.parquet"
    args = (*engine_args(model), "--chat-template-kwargs", '{"style": "terse"}')
    result = run_cli("run", source, output, *args)
    assert result.exit_code == 0, result.stderr
    rows = read_rows(output)
    assert [(row["id"], row["prompt_tokens"], row["error"]) for row in rows] == [
        ("job", len(ids(tokenizer, "terse: Hi =>")), None),
        ("row", len(ids(tokenizer, "very loud: Hi =>")), None),
        ("null", len(ids(tokenizer, "terse: Hi =>")), None),
        (
            "bad",
            None,
            "chat_template_kwargs cannot set 'tokenize': an argument of the chat template call",
        ),
    ]
    config = json.loads(pq.read_schema(output).metadata[b"astrai_batch.config"])
    assert config["chat_template_kwargs"] == {"style": "terse"}
    # `plan` renders the rows as `run` does.
    planned = run_cli(
        "plan", source, "--model", model, "--json", "--chat-template-kwargs", '{"style": "terse"}'
    )
    assert planned.exit_code == 0, planned.stderr
    report = json.loads(planned.stdout)
    assert (report["rows"], report["bad_rows"]) == (3, 1)
    assert report["prompt_tokens"] == sum(row["prompt_tokens"] or 0 for row in rows)

    refused = run_cli(
        "run",
        source,
        out / "b.parquet",
        *engine_args(model),
        "--chat-template-kwargs",
        "{style: 1}",
    )
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[-1] == (
        "Error: chat_template_kwargs is not valid JSON: Expecting property name enclosed in "
        "double quotes at column 2"
    )
    assert listing(out) == ["out.parquet", "out.stats.parquet"]
