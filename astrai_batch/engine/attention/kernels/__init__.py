"""Paged attention kernels from other libraries (FlashInfer, flash-attn), behind one interface.

`interface` is what the runner calls; `factory` builds the named kernel, importing its library
only then; `paged_kv_metadata` is the CSR / block-table description of a step both read.
"""
