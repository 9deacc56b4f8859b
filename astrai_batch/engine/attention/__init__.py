"""Attention over the paged KV pool, as the attention function transformers calls per layer.

Owns the packed batch's attention (`paged_attention`): the block plan that fixes which keys
each query reads in which block (the batch-invariant split), block and cascade attention for
shared prefixes, the fixed-shape decode attention CUDA graphs replay (`static_decode`), page
gathering, and the optional paged kernels (`kernels/`: FlashInfer, flash-attn). Imports
`runner.step_buffers` for the step's arrays and torch; never the scheduler or sampling.
"""
