"""sentence-transformers models made from the tiny test model, for the embedding tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def sentence_model_dir(tiny_dir: Path, out: Path, mode, *, dense=(), normalize=False) -> Path:
    """The tiny causal model's files, with the sentence-transformers modules (as its own
    `save` writes them) after it: Pooling(mode), a Dense per (out_features, activation),
    Normalize. sentence-transformers loads it (its Transformer reads the causal model's
    weights as the base model)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    torch.manual_seed(7)
    modules = [Transformer(str(tiny_dir)), Pooling(64, mode)]
    width = 64 * (len(mode) if isinstance(mode, tuple) else 1)
    for features, activation in dense:
        modules.append(Dense(width, features, activation_function=activation))
        width = features
    if normalize:
        modules.append(Normalize())
    saved = out.parent / f"{out.name}-saved"
    SentenceTransformer(modules=modules, device="cpu").save(str(saved))
    out.mkdir()
    for item in tiny_dir.iterdir():
        (out / item.name).symlink_to(item)
    for item in saved.iterdir():
        if item.is_dir():
            shutil.copytree(item, out / item.name)
        elif item.name.endswith(".json") and not (out / item.name).exists():
            shutil.copy(item, out / item.name)
    shutil.copy(saved / "modules.json", out / "modules.json")
    return out
