"""Scoring and embedding requests run with their row's LoRA adapter, branches included: each
continuation's log-likelihood equals transformers + PEFT's forward with that adapter, each
embedding PEFT's last hidden state; an unknown adapter is the request's error."""

from __future__ import annotations

import random

import pytest
import torch
from lora_kit import ATTENTION, _peft_model, make_adapter

from astrai_batch.engine import EngineConfig, GenerationRequest
from astrai_batch.engine.async_engine import generate_sync
from astrai_batch.engine.lora.adapter_files import read_adapter
from astrai_batch.engine.lora.bank import install_adapters, remove_adapters
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.tasks.embedding_types import EmbedRequest
from astrai_batch.engine.tasks.scoring_types import ScoreRequest

TOLERANCE = 1e-4
NAMES = [None, "mlp", "attn"]


@pytest.fixture(scope="module")
def adapter_dirs(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("task-adapters")
    return {
        "mlp": make_adapter(tiny_llama_dir, root / "mlp", rank=8, seed=4),
        "attn": make_adapter(tiny_llama_dir, root / "attn", rank=4, seed=5, targets=ATTENTION),
    }


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir, adapter_dirs):
    loaded = load_model(tiny_llama_dir)
    adapters = [read_adapter(name, str(path)) for name, path in adapter_dirs.items()]
    install_adapters(loaded.model, adapters, max_rank=16)
    yield loaded
    remove_adapters(loaded.model)


def peft(model_dir, adapter_dirs, name):
    return _peft_model(str(model_dir), None if name is None else str(adapter_dirs[name]))


def test_scores_follow_the_rows_adapter(loaded, tiny_llama_dir, adapter_dirs):
    rng = random.Random(3)
    vocab = loaded.model.config.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(40)]  # one context for every adapter
    conts = tuple(tuple(rng.randrange(3, vocab) for _ in range(n)) for n in (1, 4, 7))
    requests = [
        GenerationRequest(i, shared, score=ScoreRequest(conts), adapter=name)
        for i, name in enumerate(NAMES)
    ]
    results, _ = generate_sync(loaded, requests, EngineConfig(page_size=8, num_pages=256))
    for name, result in zip(NAMES, results, strict=True):
        assert result.error is None, result.error
        model = peft(tiny_llama_dir, adapter_dirs, name)
        for cont, score in zip(conts, result.scores, strict=True):
            tokens = shared + list(cont)
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)[len(shared) - 1 :]
            want = float(logprobs[torch.arange(len(cont)), torch.tensor(cont)].sum())
            assert abs(score.logprob - want) < TOLERANCE, (name, score.logprob, want)
    # three adapters' pages are never shared: each context computed in full
    assert [r.cached_tokens for r in results] == [0, 0, 0]


def test_embeddings_follow_the_rows_adapter(loaded, tiny_llama_dir, adapter_dirs):
    rng = random.Random(4)
    prompt = [rng.randrange(3, loaded.model.config.vocab_size) for _ in range(21)]
    embed = EmbedRequest(pooling="last", normalize=False, dimensions=None)
    requests = [GenerationRequest(i, prompt, embed=embed, adapter=n) for i, n in enumerate(NAMES)]
    results, _ = generate_sync(loaded, requests, EngineConfig(page_size=8, num_pages=256))
    for name, result in zip(NAMES, results, strict=True):
        model = peft(tiny_llama_dir, adapter_dirs, name)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
        want = out.hidden_states[-1][0, -1].float()
        got = torch.tensor(result.embedding)
        assert torch.allclose(got, want, atol=TOLERANCE), name


def test_unknown_adapter_is_the_requests_error(loaded):
    requests = [
        GenerationRequest(0, [5, 6, 7], score=ScoreRequest(((8,),)), adapter="nope"),
        GenerationRequest(1, [5, 6, 7], embed=EmbedRequest("last", False, None), adapter="nope"),
    ]
    results, _ = generate_sync(loaded, requests, EngineConfig(page_size=8, num_pages=64))
    message = "unknown LoRA adapter 'nope'; this job's adapters: mlp, attn"
    assert [r.error for r in results] == [message, message]
