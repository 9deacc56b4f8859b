"""Encoding rows with the model's tokenizer, and preparing a window: parameters and plan."""

from __future__ import annotations

import copy

import pytest

from astrai_batch.engine.model.support import no_chat_template_message
from astrai_batch.engine.sampling.params import SamplingParams
from astrai_batch.errors import AstraiBatchError
from astrai_batch.io import InputRow
from astrai_batch.io.image_sources import ImageRef
from astrai_batch.jobs.planning.prefix_order import plan_window
from astrai_batch.jobs.planning.tokenize import Encoding, PromptEncoder
from astrai_batch.jobs.planning.window import PreparedRow, prepare_window, row_params

MESSAGES = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
)


def test_prompts_messages_and_token_ids_encode_like_the_tokenizer(tiny_tokenizer) -> None:
    rows = [
        InputRow(index=0, id="p", prompt="The quick brown fox"),
        InputRow(index=1, id="m", messages=MESSAGES),
        InputRow(index=2, id="t", prompt_token_ids=(5, 6, 7)),
        InputRow(index=3, id="e", error="prompt is missing"),
    ]
    encodings = PromptEncoder(tiny_tokenizer, "tiny").encode(rows)

    chat_ids = tiny_tokenizer.apply_chat_template(
        [dict(m) for m in MESSAGES], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(chat_ids, list):  # transformers 5 may return a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    assert encodings == [
        Encoding(token_ids=tuple(tiny_tokenizer("The quick brown fox")["input_ids"])),
        Encoding(token_ids=tuple(chat_ids)),
        Encoding(token_ids=(5, 6, 7)),
        Encoding(error="prompt is missing"),
    ]
    rendered = tiny_tokenizer.decode(list(encodings[1].token_ids or ()))
    assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    assert rendered.endswith("<|im_start|>assistant\n")


def test_chat_rows_without_or_with_a_failing_template_become_row_errors(tiny_tokenizer) -> None:
    no_template = copy.deepcopy(tiny_tokenizer)
    no_template.chat_template = None
    rows = [InputRow(index=0, id="m", messages=MESSAGES), InputRow(index=1, id="p", prompt="hi")]
    encodings = PromptEncoder(no_template, "plain-model").encode(rows)
    assert encodings[0] == Encoding(error=no_chat_template_message("plain-model"))
    assert encodings[0].error == (
        "model 'plain-model' has no chat template, so chat messages cannot be turned into a "
        "prompt; give plain-text prompts or use an instruct/chat model"
    )
    assert encodings[1].token_ids is not None

    strict = copy.deepcopy(tiny_tokenizer)
    strict.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )
    (encoding,) = PromptEncoder(strict, "strict").encode(rows[:1])
    assert encoding == Encoding(error="chat template failed: no system role")


def test_rows_with_images_on_a_text_model_are_row_errors(tiny_tokenizer) -> None:
    """A text tokenizer cannot place an image's tokens: the row fails, never runs blind."""
    image_row = InputRow(
        index=0,
        id="i",
        messages=({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]},),
        images=(ImageRef(url="cat.png"),),
    )
    text_row = InputRow(index=1, id="m", messages=MESSAGES)
    encodings = PromptEncoder(tiny_tokenizer, "tiny").encode([image_row, text_row])
    assert encodings[0] == Encoding(
        error="the row has images, but model 'tiny' reads text only (use a vision model)"
    )
    assert encodings[1].token_ids is not None


def test_encoding_needs_exactly_one_of_ids_and_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Encoding()
    with pytest.raises(ValueError, match="exactly one"):
        Encoding(token_ids=(1,), error="x")


def test_row_params_apply_overrides_or_explain_them() -> None:
    base = SamplingParams(max_tokens=8)
    assert row_params(base, {}) is base
    assert row_params(base, {"temperature": 0.5, "stop": "x"}) == SamplingParams(
        max_tokens=8, temperature=0.5, stop=("x",)
    )
    assert (
        row_params(base, {"top_k": "3"})
        == "invalid sampling parameters: top_k must be an integer, got string"
    )
    assert row_params(base, {"n": 0}) == "invalid sampling parameters: n must be >= 1, got 0"


def test_prepare_window_plans_runnable_rows_and_keeps_errors_in_place(tiny_tokenizer) -> None:
    shared = "You are a helpful assistant. Answer the question briefly and precisely."
    rows = [
        InputRow(index=10, id="a", prompt=f"{shared} Why?", kept={"k": 1}),
        InputRow(index=11, id="b", prompt="Paris is the capital", overrides={"n": 2}),
        InputRow(index=12, id="c", error="prompt is empty", kept={"k": None}),
        InputRow(index=13, id="d", prompt=f"{shared} How?", overrides={"temperature": -1}),
        InputRow(index=14, id="e", prompt=f"{shared} What?", custom_id="req-e"),
    ]
    base = SamplingParams(max_tokens=4)
    window = prepare_window(
        2,
        10,
        rows,
        encoder=PromptEncoder(tiny_tokenizer, "tiny"),
        base_params=base,
        page_size=16,
        group_offset=7,
        grouping=True,
    )
    window.check_invariants()

    ids = {row.id: tuple(tiny_tokenizer(row.prompt)["input_ids"]) for row in rows if row.prompt}
    plan = plan_window([ids["a"], ids["b"], ids["e"]], page_size=16, group_offset=7)
    runnable_positions = (0, 1, 4)
    assert window.order == tuple(runnable_positions[p] for p in plan.order)
    assert (window.group_offset, window.num_groups) == (7, plan.num_groups)
    assert [row.prefix_group for row in window.rows] == [
        plan.prefix_group[0],
        plan.prefix_group[1],
        None,
        None,
        plan.prefix_group[2],
    ]
    assert window.rows[0].prefix_group == window.rows[4].prefix_group != window.rows[1].prefix_group
    assert window.rows[1].params == SamplingParams(max_tokens=4, n=2)
    assert window.rows[1].num_samples == 2
    assert window.rows[2].error == "prompt is empty" and window.rows[2].kept == {"k": None}
    assert window.rows[3].error == "invalid sampling parameters: temperature must be >= 0, got -1.0"
    assert window.rows[3].num_samples == 0
    # Rows that are not OpenAI requests answer to their row id.
    assert [row.custom_id for row in window.rows] == ["a", "b", "c", "d", "req-e"]

    requests = list(window.requests())
    assert [r.request_id for r in requests] == [window.rows[p].index for p in window.order]
    assert [r.request_id for r in window.requests(skip={10, 14})] == [11]
    assert requests[0].prompt_token_ids == window.rows[window.order[0]].token_ids
    assert window.row(13).id == "d"
    with pytest.raises(AstraiBatchError, match="row 15 is not in window 2"):
        window.row(15)


def test_prepare_window_without_grouping_runs_in_input_order(tiny_tokenizer) -> None:
    rows = [InputRow(index=i, id=str(i), prompt=text) for i, text in enumerate("zyx")]
    window = prepare_window(
        0,
        0,
        rows,
        encoder=PromptEncoder(tiny_tokenizer, "tiny"),
        base_params=SamplingParams(),
        page_size=16,
        group_offset=0,
        grouping=False,
    )
    assert window.order == (0, 1, 2)
    assert [row.prefix_group for row in window.rows] == [0, 1, 2]
    assert [row.custom_id for row in window.rows] == ["0", "1", "2"]  # their row ids


def test_prepared_row_is_runnable_or_failed() -> None:
    with pytest.raises(ValueError, match="row 3: either token_ids and params, or error"):
        PreparedRow(3, "x", None, "completion", {}, None, None, None, None)
    with pytest.raises(ValueError, match="row 3: either token_ids and params, or error"):
        PreparedRow(3, "x", None, "completion", {}, (1,), SamplingParams(), "bad", 0)
