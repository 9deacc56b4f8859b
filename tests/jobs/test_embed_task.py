"""`run --task embed`: the embedding column (fixed_size_list<float32>) against pooling
transformers' hidden states, the model's sentence-transformers pooling as the default,
normalization and truncation exact, and OpenAI /v1/embeddings lines in and out."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from jobs.jobkit import read_rows, run_cli, write_jsonl
from sentence_kit import sentence_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXTS = ["The cat sat on the mat.", "Batch inference with a prefix cache.", "Hello"]


def hf_hidden(model_dir, text):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(text)["input_ids"]
    with torch.inference_mode():
        return model.model(torch.tensor([ids])).last_hidden_state[0].float()


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), b, dim=0))


def run_embed(tmp_path, model_dir, *args):
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": t} for t in TEXTS])
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", model_dir, "--task", "embed", "-q", *args)
    assert result.exit_code == 0, result.output
    return output


def test_mean_pooling_unnormalized_matches_transformers(tmp_path, tiny_llama_dir):
    output = run_embed(tmp_path, tiny_llama_dir, "--pooling", "mean", "--no-normalize")
    field = pq.read_schema(output).field("embedding")
    assert field.type == pa.list_(pa.float32(), 64)  # the tiny model's hidden size
    for text, record in zip(TEXTS, read_rows(output), strict=True):
        assert cosine(record["embedding"], hf_hidden(tiny_llama_dir, text).mean(0)) > 0.99999


def test_default_pooling_comes_from_sentence_transformers_config(tmp_path, tiny_llama_dir):
    model_dir = tmp_path / "st-model"
    model_dir.mkdir()
    for item in tiny_llama_dir.iterdir():
        (model_dir / item.name).symlink_to(item)
    (model_dir / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "x.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "x.models.Pooling"},
            ]
        )
    )
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    output = run_embed(tmp_path, model_dir, "--dimensions", "16")
    for text, record in zip(TEXTS, read_rows(output), strict=True):
        want = torch.nn.functional.normalize(hf_hidden(tiny_llama_dir, text)[0][:16], dim=0)
        assert len(record["embedding"]) == 16
        assert cosine(record["embedding"], want) > 0.99999
        assert abs(float(torch.tensor(record["embedding"]).norm()) - 1) < 1e-6


def test_last_pooling_default_and_normalized_exactly(tmp_path, tiny_llama_dir):
    raw = read_rows(run_embed(tmp_path, tiny_llama_dir, "--no-normalize"))
    (tmp_path / "unit").mkdir()
    unit = read_rows(run_embed(tmp_path / "unit", tiny_llama_dir))
    for text, r, u in zip(TEXTS, raw, unit, strict=True):
        assert cosine(r["embedding"], hf_hidden(tiny_llama_dir, text)[-1]) > 0.99999
        expected = torch.nn.functional.normalize(torch.tensor(r["embedding"]), dim=0)
        assert torch.equal(torch.tensor(u["embedding"]), expected)


def test_openai_embeddings_lines(tmp_path, tiny_llama_dir):
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
        for i, t in enumerate(TEXTS)
    ]
    lines.append(
        {"custom_id": "bad", "url": "/v1/embeddings", "body": {"input": "x", "dimensions": 8}}
    )
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    result = run_cli(
        "run",
        source,
        output,
        "--model",
        tiny_llama_dir,
        "--task",
        "embed",
        "--output-format",
        "openai-jsonl",
        "-q",
    )
    assert result.exit_code == 0, result.output
    responses = [json.loads(x) for x in output.read_text().splitlines()]
    for text, response in zip(TEXTS, responses[:3], strict=True):
        body = response["response"]["body"]
        assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
        want = hf_hidden(tiny_llama_dir, text)[-1]
        assert cosine(body["data"][0]["embedding"], want) > 0.99999
    assert responses[3]["error"]["message"] == (
        "body.dimensions 8 cannot be honoured: the model is not a Matryoshka embedding model "
        "(its config.json has no matryoshka_dimensions or is_matryoshka), so a truncated "
        "vector would lose its meaning"
    )


def test_sentence_transformers_modules_as_sentence_transformers_encodes(tmp_path, tiny_llama_dir):
    """A sentence-transformers model (max pooling, a Dense layer to 32 values, Normalize):
    the job runs its modules, so the column is 32 wide and equals sentence-transformers'
    encode (rows given as the token ids its tokenizer makes: sentence-transformers 6 renders
    plain text through a chat template, see docs/tasks.md)."""
    from sentence_transformers import SentenceTransformer

    model_dir = sentence_model_dir(
        tiny_llama_dir, tmp_path / "st", "max", dense=[(32, torch.nn.Tanh())], normalize=True
    )
    reference = SentenceTransformer(str(model_dir), device="cpu")
    ids = [reference.preprocess([t])["input_ids"][0].tolist() for t in TEXTS]
    want = reference.encode(TEXTS)
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt_token_ids": i} for i in ids])
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", model_dir, "--task", "embed", "-q")
    assert result.exit_code == 0, result.output
    assert pq.read_schema(output).field("embedding").type == pa.list_(pa.float32(), 32)
    for record, vector in zip(read_rows(output), want, strict=True):
        torch.testing.assert_close(
            torch.tensor(record["embedding"]), torch.tensor(vector), rtol=1e-4, atol=2e-5
        )


def test_a_module_it_cannot_run_is_refused_at_start(tmp_path, tiny_llama_dir):

    model_dir = sentence_model_dir(tiny_llama_dir, tmp_path / "st", "mean")
    modules = json.loads((model_dir / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_CNN", "type": "sentence_transformers.CNN"})
    (model_dir / "modules.json").write_text(json.dumps(modules))
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": t} for t in TEXTS])
    output = tmp_path / "out.parquet"
    result = run_cli("run", source, output, "--model", model_dir, "--task", "embed", "-q")
    assert result.exit_code == 1
    assert (
        "the model's sentence-transformers module 2_CNN (sentence_transformers.CNN) at "
        "position 2 is not supported" in result.output
    )
    assert not output.exists()


def test_dimensions_on_a_matryoshka_model_as_sentence_transformers_truncate_dim(
    tmp_path, tiny_llama_dir
):
    """body.dimensions on a model whose config.json lists its Matryoshka dimensions (vLLM's
    rule): sentence-transformers' truncate_dim output, renormalized; a size it was not
    trained at is refused."""
    from sentence_transformers import SentenceTransformer

    model_dir = sentence_model_dir(tiny_llama_dir, tmp_path / "st", "mean", normalize=True)
    config = json.loads((model_dir / "config.json").read_text())
    config["matryoshka_dimensions"] = [16, 32]
    (model_dir / "config.json").unlink()  # a link to the shared tiny model's: never write through
    (model_dir / "config.json").write_text(json.dumps(config))
    reference = SentenceTransformer(str(model_dir), device="cpu", truncate_dim=16)
    ids = [reference.preprocess([t])["input_ids"][0].tolist() for t in TEXTS]
    want = reference.encode(TEXTS, normalize_embeddings=True)
    lines = [
        {"custom_id": f"e{i}", "url": "/v1/embeddings", "body": {"input": x, "dimensions": 16}}
        for i, x in enumerate(ids)
    ]
    lines.append(
        {"custom_id": "odd", "url": "/v1/embeddings", "body": {"input": "x", "dimensions": 8}}
    )
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    result = run_cli("run", source, output, "--model", model_dir, "--max-tokens", "2", "-q")
    assert result.exit_code == 0, result.output
    responses = [json.loads(x) for x in output.read_text().splitlines()]
    for response, vector in zip(responses, want, strict=False):
        got = response["response"]["body"]["data"][0]["embedding"]
        assert len(got) == 16
        torch.testing.assert_close(torch.tensor(got), torch.tensor(vector), rtol=1e-4, atol=2e-5)
    assert responses[-1]["error"]["message"] == (
        "body.dimensions 8 is not one of the model's Matryoshka dimensions (16, 32)"
    )
