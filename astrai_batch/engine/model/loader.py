"""Loading a model and its tokenizer from a directory, a GGUF file, an alias or a hub id.

Every load reads the config first and checks the architecture before touching weights, and
every failure surfaces as one `ModelLoadError` (or `UnsupportedModelError`) that says what was
looked for, with the library's own error chained underneath.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from astrai_batch.checks import require_positive_int
from astrai_batch.engine.model.converted import is_complete
from astrai_batch.engine.model.gguf import converted_dir_for, ensure_converted, error_summary
from astrai_batch.engine.model.library_progress import library_progress_off
from astrai_batch.engine.model.loaded import LoadedModel, resolve_dtype
from astrai_batch.engine.model.model_facts import loaded_model
from astrai_batch.engine.model.spec import (
    ModelSpec,
    alias_list,
    did_you_mean,
    resolve_model_spec,
)
from astrai_batch.engine.model.support import (
    check_supported,
    is_vision_model,
    language_config,
)
from astrai_batch.engine.model.support import describe_model as describe_config
from astrai_batch.engine.vision.loading import load_vision_model
from astrai_batch.errors import ConfigError, ModelLoadError, UnsupportedModelError

# Tokenizers without a real limit report about 1e30; anything this large is not a limit.
_SANE_TOKENIZER_MAX_LEN = 1 << 24


def _load_error(
    spec: ModelSpec, what: str, err: Exception, *, first_contact: bool = False
) -> ModelLoadError:
    """The error for a failed step; the first read of a hub id may mean it does not exist."""
    if "trust_remote_code" in str(err):
        # transformers' own verdict: the model's classes exist only in its repository's code.
        return ModelLoadError(
            f"Model {spec.name!r} needs code from its own files to load ({what}); pass "
            "--trust-remote-code to run it, if you trust its source"
        )
    if spec.kind == "hub" and first_contact:
        return ModelLoadError(
            f"Could not load model {spec.location!r}: it is not a local path or a known model "
            f"alias ({alias_list()}), and as a Hugging Face hub id its {what} could not be "
            f"loaded: {error_summary(err)}" + did_you_mean(spec.name)
        )
    return ModelLoadError(
        f"Could not load the {what} of model {spec.name!r} from {spec.location}: "
        f"{error_summary(err)}"
    )


def _weights_size(model_spec: ModelSpec) -> str:
    """The size of a local model's weight files, for the loading message."""
    location = Path(model_spec.location)
    if not location.is_dir():
        return "from the hub"
    size = sum(
        path.stat().st_size
        for pattern in ("*.safetensors", "*.bin")
        for path in location.glob(pattern)
    )
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def _resolve_device(device: str) -> torch.device:
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"unknown device {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was requested but CUDA is not available")
    return resolved


@library_progress_off()
def load_model(
    spec: str | os.PathLike[str],
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    revision: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    tp_timeout: float = 120.0,
    on_stage: Callable[[str], None] | None = None,
) -> LoadedModel:
    """Load a causal LM and its fast tokenizer; see `resolve_model_spec` for what `spec` may be.

    A GGUF file (or the `smollm2-135m` alias) is converted once into the cache under
    `cache_dir` (default `$ASTRAI_BATCH_CACHE`, else ~/.cache/astrai-batch) and loaded from there.
    `revision` (a branch, tag or commit of a hub model) is refused for local models, whose
    files have no revisions. Code shipped with a model runs only with `trust_remote_code`.
    `max_model_len` caps the context below the model's own; the model is checked at the
    context it will run at (a sliding window or longrope threshold above it never binds).
    `tensor_parallel_size` > 1 starts that many ranks and loads this process's shard
    (`engine.parallel.launch`); `tp_timeout` bounds every wait on another rank. `on_stage` is
    told, in a sentence, each slow step as it starts (converting a GGUF, reading weights).
    """
    prepared = prepare_load(
        spec,
        device=device,
        dtype=dtype,
        revision=revision,
        trust_remote_code=trust_remote_code,
        cache_dir=cache_dir,
        max_model_len=max_model_len,
        on_stage=on_stage,
    )
    if tensor_parallel_size != 1 and is_vision_model(prepared.config):
        raise UnsupportedModelError(
            f"{describe_config(prepared.config)} is a vision-language model: tensor "
            "parallelism does not run one; leave --tensor-parallel-size at 1"
        )
    if tensor_parallel_size != 1:
        from astrai_batch.engine.parallel.launch import load_parallel

        return load_parallel(prepared, world_size=tensor_parallel_size, timeout_s=tp_timeout)
    model_spec, hub, config = prepared.model_spec, prepared.hub, prepared.config
    torch_dtype, target_device = prepared.dtype, prepared.device
    weights: dict[str, Any] = {"config": config, "dtype": torch_dtype}
    if model_spec.kind == "directory" and any(Path(model_spec.location).glob("*.safetensors")):
        weights["use_safetensors"] = True
    if target_device.type != "cpu":
        weights["device_map"] = {"": target_device}
    if on_stage is not None:
        on_stage(f"reading the weights of {model_spec.name} ({_weights_size(model_spec)})")
    vision = None
    try:
        if is_vision_model(config):
            model, vision = load_vision_model(model_spec.location, hub, weights)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_spec.location, **hub, **weights)
    except Exception as err:
        raise _load_error(model_spec, "weights", err) from err
    model.eval()
    model.requires_grad_(False)
    loaded = loaded_model(model, prepared.tokenizer, model_spec, prepared.context)
    if vision is None:
        return loaded
    return dataclasses.replace(loaded, vision=vision, architecture=describe_config(config))


class PreparedLoad(NamedTuple):
    """What a load knows before any weight is read: the model checked at its context."""

    model_spec: ModelSpec
    hub: dict[str, Any]
    config: Any
    tokenizer: PreTrainedTokenizerBase
    context: int
    dtype: torch.dtype
    device: torch.device


def prepare_load(
    spec: str | os.PathLike[str],
    *,
    device: str,
    dtype: str | torch.dtype,
    revision: str | None,
    trust_remote_code: bool,
    cache_dir: str | os.PathLike[str] | None,
    max_model_len: int | None,
    on_stage: Callable[[str], None] | None = None,
) -> PreparedLoad:
    if max_model_len is not None:
        require_positive_int("max_model_len", max_model_len)
    target_device = _resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device=target_device)  # a bad name fails before slow work
    model_spec = resolve_model_spec(spec, revision)
    hub = _hub_options(model_spec, revision, trust_remote_code)
    if model_spec.kind == "gguf":
        gguf_path = Path(model_spec.location)
        if on_stage is not None and not is_complete(converted_dir_for(gguf_path, cache_dir)):
            size = gguf_path.stat().st_size / 2**20
            on_stage(
                f"converting {gguf_path.name} ({size:.0f} MiB) into safetensors in the model "
                "cache; once per file, later runs skip this"
            )
        converted = ensure_converted(gguf_path, cache_dir)
        model_spec = ModelSpec("directory", model_spec.name, str(converted))
    try:
        config = AutoConfig.from_pretrained(model_spec.location, **hub)
    except Exception as err:
        raise _load_error(model_spec, "config", err, first_contact=True) from err
    check_supported(config)
    tokenizer = _load_tokenizer_at(model_spec, hub, first_contact=False)
    context = _max_model_len(language_config(config), tokenizer, model_spec)
    if max_model_len is not None:
        context = min(context, max_model_len)
    check_supported(config, max_model_len=context)  # still before any weights are read
    return PreparedLoad(model_spec, hub, config, tokenizer, context, torch_dtype, target_device)


@library_progress_off()
def load_tokenizer(
    spec: str | os.PathLike[str],
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedTokenizerBase, str]:
    """The fast tokenizer for `spec` and where it was read from, without loading any weights.

    For a GGUF file the converted cache is used when present; otherwise only the tokenizer is
    read from the GGUF itself (no conversion is started).
    """
    model_spec = resolve_model_spec(spec, revision)
    hub = _hub_options(model_spec, revision, trust_remote_code)
    if model_spec.kind == "gguf":
        gguf_path = Path(model_spec.location)
        converted = converted_dir_for(gguf_path, cache_dir)
        if is_complete(converted):
            model_spec = ModelSpec("directory", model_spec.name, str(converted))
        else:
            try:
                tokenizer = AutoTokenizer.from_pretrained(
                    str(gguf_path.parent), gguf_file=gguf_path.name
                )
            except Exception as err:
                raise _load_error(model_spec, "tokenizer", err) from err
            _require_fast(tokenizer, model_spec)
            return tokenizer, str(gguf_path)
    tokenizer = _load_tokenizer_at(model_spec, hub, first_contact=True)
    return tokenizer, model_spec.location


def model_files_dir(loaded: LoadedModel, revision: str | None = None) -> Path | None:
    """The local directory holding the files `loaded` was read from: its own directory, or
    for a hub model the cached snapshot of `revision` (None when it is not in the cache)."""
    source = Path(loaded.source)
    if source.is_dir():
        return source
    from huggingface_hub import try_to_load_from_cache

    config_file = try_to_load_from_cache(loaded.source, "config.json", revision=revision)
    return Path(config_file).parent if isinstance(config_file, str) else None


def _hub_options(
    model_spec: ModelSpec, revision: str | None, trust_remote_code: bool
) -> dict[str, Any]:
    """`from_pretrained` keywords for the revision and remote code options."""
    if revision is not None and model_spec.kind != "hub":
        raise ConfigError(
            f"--revision {revision} applies to hub models only; {model_spec.name!r} is a local "
            f"{'GGUF file' if model_spec.kind == 'gguf' else 'directory'}"
        )
    options: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if model_spec.local_only:  # no retries against a hub that cannot answer
        options["local_files_only"] = True
    if revision is not None:
        options["revision"] = revision
    return options


def _load_tokenizer_at(
    model_spec: ModelSpec, hub: dict[str, Any], *, first_contact: bool
) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_spec.location, **hub)
    except Exception as err:
        raise _load_error(model_spec, "tokenizer", err, first_contact=first_contact) from err
    _require_fast(tokenizer, model_spec)
    return tokenizer


def _require_fast(tokenizer: PreTrainedTokenizerBase, model_spec: ModelSpec) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(
            f"The tokenizer of model {model_spec.name!r} is not a fast tokenizer "
            "(no tokenizer.json); astrai-batch needs one"
        )


def describe_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, name: str, source: str
) -> LoadedModel:
    """A `LoadedModel` for a model built in memory (random weights for checks and benches),
    checked like a loaded one."""
    spec = ModelSpec("directory", name, source)
    context = _max_model_len(model.config, tokenizer, spec)
    check_supported(model.config, max_model_len=context)
    return loaded_model(model, tokenizer, spec, context)


def _max_model_len(config: Any, tokenizer: PreTrainedTokenizerBase, model_spec: ModelSpec) -> int:
    candidates = []
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        candidates.append(positions)
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit <= _SANE_TOKENIZER_MAX_LEN:
        candidates.append(tokenizer_limit)
    if not candidates:
        raise ModelLoadError(
            f"Model {model_spec.name!r} states no context length (neither "
            "max_position_embeddings nor a tokenizer model_max_length)"
        )
    return min(candidates)
