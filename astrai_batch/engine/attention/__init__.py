"""Attention over the paged KV pool, as the attention function transformers calls per layer.

Owns the packed batch's attention (`paged_attention`): the block plan that fixes which keys
each query reads in which block (the batch-invariant split), block and cascade attention for
shared prefixes, the fixed-shape decode attention CUDA graphs replay (`static_decode`), page
gathering, pinned host-to-device copies (`host_staging`), the step's host arrays
(`step_arrays`), and the optional paged kernels (`kernels/`: FlashInfer, flash-attn). Imports
torch, `model.loaded` and `blas_rows`; never the runner, the scheduler or sampling.
"""
