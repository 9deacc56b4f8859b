"""A sentence-transformers model's Pooling, Dense and Normalize modules, read from its
directory, give what sentence-transformers' own `encode` gives (on the token ids its own
tokenizer makes), for every pooling mode; modules we cannot run are refused naming them."""

from __future__ import annotations

import json

import pytest
import torch
from sentence_kit import sentence_model_dir

from astrai_batch.engine import EngineConfig, GenerationRequest, generate_sync
from astrai_batch.engine.model.loader import load_model
from astrai_batch.engine.tasks.embedding_types import DenseStep, NormalizeStep
from astrai_batch.engine.tasks.sentence_modules import read_sentence_modules
from astrai_batch.errors import ConfigError
from astrai_batch.jobs.planning.embed_rows import job_embed_request

st = pytest.importorskip("sentence_transformers")

TEXTS = ["The cat sat on the mat.", "Batch inference with a prefix cache.", "Hello"]
ST_MODES = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir)


def engine_vectors(loaded, request, prompts):
    requests = [GenerationRequest(i, p, embed=request) for i, p in enumerate(prompts)]
    config = EngineConfig(page_size=8, num_pages=256, max_num_batched_tokens=16)
    results, _ = generate_sync(loaded, requests, config)
    assert all(r.error is None for r in results)
    return torch.tensor([r.embedding for r in results])


def st_reference(model_dir):
    """sentence-transformers' encode of TEXTS, and the token ids its tokenizer gave them."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    ids = [model.preprocess([text])["input_ids"][0].tolist() for text in TEXTS]
    return torch.tensor(model.encode(TEXTS, convert_to_numpy=True)), ids


@pytest.mark.parametrize("mode", ST_MODES)
@pytest.mark.parametrize(
    "head",
    [
        {},
        {"dense": [(32, torch.nn.Tanh())], "normalize": True},
        {"dense": [(48, torch.nn.GELU()), (24, torch.nn.Identity())]},
    ],
    ids=["pooling", "dense-tanh-normalize", "two-dense"],
)
def test_equals_sentence_transformers_encode(loaded, tiny_llama_dir, tmp_path, mode, head):
    model_dir = sentence_model_dir(tiny_llama_dir, tmp_path / "st", mode, **head)
    want, prompts = st_reference(model_dir)
    request = job_embed_request(None, False, None, model_dir, hidden_size=64)
    got = engine_vectors(loaded, request, prompts)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)


def test_the_model_head_then_truncation_and_unit_norm(loaded, tiny_llama_dir, tmp_path):
    """--dimensions and --normalize act on the head's output, as sentence-transformers'
    `truncate_dim` and `normalize_embeddings`."""
    from sentence_transformers import SentenceTransformer

    model_dir = sentence_model_dir(
        tiny_llama_dir, tmp_path / "st", "mean", dense=[(32, torch.nn.Tanh())]
    )
    model = SentenceTransformer(str(model_dir), device="cpu", truncate_dim=12)
    want = torch.tensor(model.encode(TEXTS, normalize_embeddings=True))
    prompts = [model.preprocess([text])["input_ids"][0].tolist() for text in TEXTS]
    request = job_embed_request(None, True, 12, model_dir, hidden_size=64)
    torch.testing.assert_close(engine_vectors(loaded, request, prompts), want, rtol=1e-4, atol=2e-5)


def test_reads_modules_in_order(tiny_llama_dir, tmp_path):
    model_dir = sentence_model_dir(
        tiny_llama_dir,
        tmp_path / "st",
        "weightedmean",
        dense=[(32, torch.nn.Tanh())],
        normalize=True,
    )
    modules = read_sentence_modules(model_dir)
    assert modules.pooling == "weighted-mean"
    dense, norm = modules.head
    assert isinstance(dense, DenseStep) and isinstance(norm, NormalizeStep)
    assert (dense.in_features, dense.out_features, dense.activation) == (64, 32, "tanh")
    assert read_sentence_modules(tiny_llama_dir) is None


def refusal(model_dir, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        job_embed_request(options.get("pooling"), True, options.get("dimensions"), model_dir, 64)
    return str(caught.value)


def test_refuses_what_it_cannot_run_naming_it(tiny_llama_dir, tmp_path):
    model_dir = sentence_model_dir(tiny_llama_dir, tmp_path / "st", "mean")
    modules = json.loads((model_dir / "modules.json").read_text())

    def write_modules(entries):
        (model_dir / "modules.json").write_text(json.dumps(entries))

    write_modules([*modules, {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "x.LayerNorm"}])
    assert refusal(model_dir) == (
        "the model's sentence-transformers module 2_LayerNorm (x.LayerNorm) at position 2 is "
        "not supported; an embedding job runs Transformer, then Pooling, then Dense and "
        "Normalize modules"
    )
    write_modules(modules[:1])
    assert refusal(model_dir) == (
        "the model's sentence-transformers modules.json declares no Pooling module; choose "
        "one with --pooling"
    )
    write_modules(modules)
    pooling = model_dir / modules[1]["path"] / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode": ["cls", "mean"]}))
    assert refusal(model_dir) == (
        f"the model's sentence-transformers Pooling {modules[1]['path']} ({modules[1]['type']}) "
        "asks for pooling cls, mean; supported: one of cls, max, mean, mean_sqrt_len_tokens, "
        "weightedmean, lasttoken (concatenated modes are not)"
    )
    pooling.write_text(json.dumps({"pooling_mode_cls_token": True}))  # the older keys
    assert read_sentence_modules(model_dir).pooling == "cls"
    assert refusal(model_dir, pooling="mean", dimensions=65) == (
        "--dimensions 65 exceeds the model's embedding size of 64"
    )


def test_refuses_an_unknown_dense_activation(tiny_llama_dir, tmp_path):
    model_dir = sentence_model_dir(
        tiny_llama_dir, tmp_path / "st", "mean", dense=[(32, torch.nn.Tanh())]
    )
    dense = next(model_dir.glob("*_Dense"))
    config = json.loads((dense / "config.json").read_text())
    config["activation_function"] = "torch.nn.modules.activation.Softplus"
    (dense / "config.json").write_text(json.dumps(config))
    assert refusal(model_dir) == (
        f"the model's sentence-transformers Dense {dense.name} "
        "(sentence_transformers.base.modules.dense.Dense) applies "
        "torch.nn.modules.activation.Softplus; supported activations: "
        "torch.nn.modules.linear.Identity, torch.nn.modules.activation.Tanh, "
        "torch.nn.modules.activation.Sigmoid, torch.nn.modules.activation.ReLU, "
        "torch.nn.modules.activation.GELU"
    )


def test_a_prompt_over_max_seq_length_is_a_row_error(loaded, tiny_llama_dir, tmp_path):
    """sentence-transformers truncates a longer input; the job says so rather than embed
    something else than either would."""
    model_dir = sentence_model_dir(tiny_llama_dir, tmp_path / "st", "mean")
    config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    config["max_seq_length"] = 6
    (model_dir / "sentence_bert_config.json").write_text(json.dumps(config))
    request = job_embed_request(None, True, None, model_dir, hidden_size=64)
    assert request.max_prompt_tokens == 6
    requests = [GenerationRequest(0, [5] * 7, embed=request)]
    requests.append(GenerationRequest(1, [5] * 6, embed=request))
    (long, fits), _ = generate_sync(loaded, requests, EngineConfig(page_size=8, num_pages=64))
    assert long.error == (
        "prompt (7 tokens) exceeds the model's sentence-transformers max_seq_length of 6 "
        "tokens (sentence-transformers would truncate it)"
    )
    assert fits.error is None and len(fits.embedding) == 64
