"""Building the kernel a resolved backend name stands for, importing its library only then.

Apart from `interface` so that the kernels can import the interface without a circle.
"""

from __future__ import annotations

import torch

from astrai_batch.engine.attention.kernels.interface import PagedKernel


def make_kernel(backend: str, device: torch.device) -> PagedKernel | None:
    """The kernel of a resolved backend name; None for `sdpa`. Imports the kernel lazily."""
    if backend == "sdpa":
        return None
    if backend == "flashinfer":
        from astrai_batch.engine.attention.kernels.flashinfer_kernel import FlashInferKernel

        return FlashInferKernel(device)
    if backend == "flash-attn":
        from astrai_batch.engine.attention.kernels.flash_attn_kernel import FlashAttnKernel

        return FlashAttnKernel(device)
    raise ValueError(f"no kernel for attention backend {backend!r}")
