"""A PEFT LoRA adapter directory, read without PEFT: `adapter_config.json` and
`adapter_model.safetensors`, on a local path or a URI.

Only what changes the forward pass matters here. The configuration keys that PEFT uses only
to initialize or train an adapter (their effect is in the saved weights) are ignored; every
other key must hold its neutral value, else the adapter is refused by name, so an adapter
whose forward we would compute differently from PEFT never runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from astrai_batch.errors import AdapterError
from astrai_batch.io.filesystems import Location, resolve

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."

# Keys that describe how an adapter was made or trained, not how it computes.
_IGNORED_KEYS = frozenset(
    {
        "auto_mapping",
        "base_model_name_or_path",
        "corda_config",
        "eva_config",
        "exclude_modules",
        "inference_mode",
        "init_lora_weights",
        "layers_pattern",
        "layers_to_transform",
        "loftq_config",
        "lora_dropout",
        "lora_ga_config",
        "megatron_config",
        "megatron_core",
        "peft_version",
        "qalora_group_size",
        "revision",
        "task_type",
        "ensure_weight_tying",
    }
)
# Keys we read; their values are checked one by one below.
_READ_KEYS = frozenset({"peft_type", "r", "lora_alpha", "target_modules", "use_rslora", "bias"})
# Features with their own words in the refusal (the rest: "uses <key>").
_FEATURE_NAMES = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "modules_to_save (fully trained layers)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
    "lora_bias": "a LoRA bias (lora_bias)",
    "rank_pattern": "per-layer ranks (rank_pattern)",
    "alpha_pattern": "per-layer alphas (alpha_pattern)",
}


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    alpha: float
    use_rslora: bool

    @property
    def scaling(self) -> float:
        """PEFT's: alpha / r, or alpha / sqrt(r) for rank-stabilized LoRA."""
        if self.use_rslora:
            return self.alpha / math.sqrt(self.rank)
        return self.alpha / self.rank


@dataclass(frozen=True, eq=False)
class AdapterFiles:
    """One adapter as read: its configuration, the A and B matrix of every target module
    (by module path in the base model), and a digest of both files (the job identity's)."""

    name: str
    shown: str  # the path or URI as the user gave it
    config: AdapterConfig
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A [r, in], B [out, r])
    digest: str

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def adapter_digest(path: str) -> str:
    """sha256 over the adapter's two files (what makes it the adapter it is), read from
    `path`; the resumed job's identity check compares it."""
    location = _location(path)
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        data = _read(location.child(name), path)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def read_adapter(name: str, path: str) -> AdapterFiles:
    from safetensors.torch import load as load_safetensors

    location = _location(path)
    config_bytes = _read(location.child(CONFIG_FILE), path)
    weight_bytes = _read(location.child(WEIGHTS_FILE), path)
    config = parse_config(name, config_bytes)
    try:
        tensors = load_safetensors(weight_bytes)
    except Exception as exc:
        raise AdapterError(f"adapter {name!r}: {WEIGHTS_FILE} is not readable: {exc}") from exc
    digest = hashlib.sha256()
    for data in (config_bytes, weight_bytes):
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return AdapterFiles(
        name=name,
        shown=path,
        config=config,
        weights=_pair_weights(name, tensors),
        digest=digest.hexdigest(),
    )


def parse_config(name: str, data: bytes) -> AdapterConfig:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is not a JSON object")
    kind = raw.get("peft_type")
    if kind != "LORA":
        raise AdapterError(f"adapter {name!r} is a {kind} adapter; only LoRA is supported")
    for key, value in raw.items():
        if key in _IGNORED_KEYS or key in _READ_KEYS:
            continue
        if value in (None, False, {}, [], ""):
            continue
        feature = _FEATURE_NAMES.get(key, key)
        raise AdapterError(f"adapter {name!r} uses {feature}, which is not supported")
    if raw.get("bias", "none") != "none":
        raise AdapterError(
            f"adapter {name!r} trains biases (bias={raw['bias']!r}), which is not supported"
        )
    rank, alpha = raw.get("r"), raw.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise AdapterError(f"adapter {name!r}: r must be a positive integer, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise AdapterError(f"adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    return AdapterConfig(rank=rank, alpha=float(alpha), use_rslora=bool(raw.get("use_rslora")))


def _pair_weights(
    name: str, tensors: dict[str, torch.Tensor]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, part = _split_key(name, key)
        halves.setdefault(module, {})[part] = tensor
    pairs = {}
    for module, parts in sorted(halves.items()):
        if set(parts) != {"A", "B"}:
            missing = "lora_B" if "A" in parts else "lora_A"
            raise AdapterError(f"adapter {name!r}: {module} has no {missing} weight")
        a, b = parts["A"], parts["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(
                f"adapter {name!r}: {module}'s lora_A {list(a.shape)} and lora_B "
                f"{list(b.shape)} do not make a low-rank product"
            )
        pairs[module] = (a, b)
    if not pairs:
        raise AdapterError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return pairs


def _split_key(name: str, key: str) -> tuple[str, str]:
    """`base_model.model.<module>.lora_A.weight` -> (module, "A")."""
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if key.startswith(KEY_PREFIX) and key.endswith(suffix):
            return key[len(KEY_PREFIX) : -len(suffix)], part
    if "lora_embedding" in key:
        raise AdapterError(f"adapter {name!r} adapts an embedding layer, which is not supported")
    raise AdapterError(f"adapter {name!r}: unexpected tensor {key} in {WEIGHTS_FILE}")


def _location(path: str) -> Location:
    return resolve(path, AdapterError)


def _read(location: Location, path: str) -> bytes:
    if not location.is_file(AdapterError):
        raise AdapterError(f"LoRA adapter {path} has no {location.name}")
    try:
        return location.read_bytes()
    except OSError as exc:
        raise AdapterError(f"cannot read {location.shown}: {exc}") from exc


def read_adapters(specs: Sequence[tuple[str, str]], *, max_rank: int) -> list[AdapterFiles]:
    """Every adapter of a job, read and checked as far as the files alone can say (kind,
    rank), so a bad adapter is refused before the model loads."""
    adapters = []
    for name, path in specs:
        adapter = read_adapter(name, path)
        if adapter.config.rank > max_rank:
            raise AdapterError(
                f"adapter {name!r} has rank {adapter.config.rank}, above --max-lora-rank {max_rank}"
            )
        adapters.append(adapter)
    return adapters
