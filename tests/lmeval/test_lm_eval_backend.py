"""The `astrai-batch` lm-eval backend against lm-eval's own hf backend, through lm-eval's
evaluator (`simple_evaluate`) on three tasks of our own (tests/lm_eval_kit.py), the tiny
Llama, float32, offline: per-sample log-likelihoods within float tolerance, the same is_greedy
and acc, the same rolling log-likelihoods (several windows per document: max length 64), the
same greedy generations; and our samples bitwise equal at batch sizes 1, 4 and 64.

lm-eval is an extra (`astrai-batch[lm-eval]`); scripts/test-long installs it beside the venv
and puts it on the path of these tests (long: about 40 packages to install and over a minute
on 2 cores); skipped where it is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from lm_eval_kit import GEN_TASK, MC_TASK, PPL_TASK, TASKS, write_tasks

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.long

MAX_LENGTH = 64
TOLERANCE = 1e-4
BATCH_SIZES = (1, 4, 64)


@pytest.fixture(scope="module")
def lm_eval_env(tmp_path_factory):
    """lm-eval offline, its datasets cache in a temporary folder."""
    cache = tmp_path_factory.mktemp("hf-cache")
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE")}
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (the lm-eval extra)")
    from lm_eval.tasks import TaskManager

    import astrai_batch.lm_eval  # noqa: F401  (registers astrai-batch)

    tasks = write_tasks(tmp_path_factory.mktemp("tasks"))
    yield lm_eval, TaskManager(include_path=str(tasks))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def evaluate(
    lm_eval_env, model: str, model_args: str, batch_size: int, tasks=TASKS, **options
) -> dict:
    lm_eval, manager = lm_eval_env
    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=manager,
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
        bootstrap_iters=0,
        **options,
    )


def samples(result: dict, task: str) -> list[dict]:
    return sorted(result["samples"][task], key=lambda s: s["doc_id"])


@pytest.fixture(scope="module")
def runs(lm_eval_env, tiny_llama_dir):
    """lm-eval's hf backend (batch size 1: no padding) and ours at every batch size."""
    hf = evaluate(
        lm_eval_env, "hf", f"pretrained={tiny_llama_dir},dtype=float32,max_length={MAX_LENGTH}", 1
    )
    ours = {
        size: evaluate(
            lm_eval_env,
            "astrai-batch",
            f"model={tiny_llama_dir},dtype=float32,max_model_len={MAX_LENGTH},max_num_seqs=8",
            size,
        )
        for size in BATCH_SIZES
    }
    return hf, ours


def test_multiple_choice_loglikelihoods_and_acc_match_hf(runs):
    hf, ours = runs
    theirs, mine = samples(hf, MC_TASK), samples(ours[1], MC_TASK)
    assert len(mine) == len(theirs) == 8
    for a, b in zip(theirs, mine, strict=True):
        assert a["arguments"] == b["arguments"]  # the same contexts (few-shot included)
        for (ref,), (got,) in zip(a["resps"], b["resps"], strict=True):
            assert abs(ref[0] - got[0]) <= TOLERANCE, (ref, got)
            assert ref[1] == got[1]
        assert a["acc"] == b["acc"]
    assert hf["results"][MC_TASK]["acc,none"] == ours[1]["results"][MC_TASK]["acc,none"]


def test_rolling_loglikelihoods_match_hf_over_several_windows(runs, tiny_llama_dir):
    from transformers import AutoTokenizer

    hf, ours = runs
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    theirs, mine = samples(hf, PPL_TASK), samples(ours[1], PPL_TASK)
    lengths = [len(tokenizer.encode(s["arguments"][0][0])) for s in mine]
    assert max(lengths) > 2 * MAX_LENGTH  # the long documents span three windows
    for a, b in zip(theirs, mine, strict=True):
        ref, got = a["resps"][0][0], b["resps"][0][0]
        assert abs(ref - got) <= TOLERANCE * max(1.0, abs(ref) / 100), (ref, got)
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        ref, got = hf["results"][PPL_TASK][metric], ours[1]["results"][PPL_TASK][metric]
        assert got == pytest.approx(ref, rel=1e-5)


def test_greedy_generations_equal_hf(runs):
    hf, ours = runs
    theirs, mine = samples(hf, GEN_TASK), samples(ours[1], GEN_TASK)
    generated = [b["resps"][0][0] for b in mine]
    assert generated == [a["resps"][0][0] for a in theirs]
    assert all(generated)  # none empty: the stop rule left text to compare


@pytest.mark.parametrize("size", BATCH_SIZES[1:])
def test_results_are_bitwise_the_same_at_every_batch_size(runs, size):
    _, ours = runs
    for task in TASKS:
        assert [s["resps"] for s in samples(ours[size], task)] == [
            s["resps"] for s in samples(ours[1], task)
        ]
    assert ours[size]["results"] == ours[1]["results"]


def test_the_name_is_registered_and_declared_as_an_entry_point(lm_eval_env):
    from lm_eval.api.registry import get_model

    from astrai_batch.lm_eval import AstraiBatchLM

    assert get_model("astrai-batch") is AstraiBatchLM
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    entry = pyproject["project"]["entry-points"]["lm_eval.models"]["astrai-batch"]
    assert entry == "astrai_batch.lm_eval:AstraiBatchLM"


def test_unknown_model_args_are_refused_before_loading(lm_eval_env):
    from astrai_batch.errors import ConfigError
    from astrai_batch.lm_eval import AstraiBatchLM

    with pytest.raises(ConfigError, match=r"unknown model_args for astrai-batch: pretrained"):
        AstraiBatchLM.create_from_arg_string("pretrained=gpt2")


def test_a_lora_adapter_scores_as_the_hf_backend_with_peft(lm_eval_env, tiny_llama_dir, tmp_path):
    """model_args lora=NAME=PATH against lm-eval's hf backend loading the adapter with PEFT."""
    from lora_kit import ATTENTION, make_adapter

    adapter = make_adapter(tiny_llama_dir, tmp_path / "adapter", rank=4, seed=5, targets=ATTENTION)
    hf = evaluate(
        lm_eval_env, "hf", f"pretrained={tiny_llama_dir},dtype=float32,peft={adapter}", 1, [MC_TASK]
    )
    ours = evaluate(
        lm_eval_env,
        "astrai-batch",
        f"model={tiny_llama_dir},dtype=float32,lora=tuned={adapter}",
        1,
        [MC_TASK],
    )
    base = evaluate(
        lm_eval_env, "astrai-batch", f"model={tiny_llama_dir},dtype=float32", 1, [MC_TASK]
    )
    theirs, mine, plain = (samples(r, MC_TASK) for r in (hf, ours, base))
    for a, b in zip(theirs, mine, strict=True):
        for (ref,), (got,) in zip(a["resps"], b["resps"], strict=True):
            assert abs(ref[0] - got[0]) <= TOLERANCE, (ref, got)
            assert ref[1] == got[1]
    assert [s["resps"] for s in mine] != [s["resps"] for s in plain]  # the adapter acts


def test_chat_template_generations_equal_hf(lm_eval_env, tiny_llama_dir):
    """`apply_chat_template=True`: the prompt is rendered by our apply_chat_template, as the
    hf backend renders it, and greedy generations agree."""
    runs = [
        evaluate(
            lm_eval_env,
            model,
            f"{key}={tiny_llama_dir},dtype=float32",
            1,
            [GEN_TASK],
            apply_chat_template=True,
        )
        for model, key in (("hf", "pretrained"), ("astrai-batch", "model"))
    ]
    theirs, mine = (samples(r, GEN_TASK) for r in runs)
    assert [s["arguments"] for s in mine] == [s["arguments"] for s in theirs]
    assert "<|im_start|>assistant" in mine[0]["arguments"][0][0]  # the template was applied
    assert [s["resps"] for s in mine] == [s["resps"] for s in theirs]
