"""Whether attention runs in the C kernel on this CPU (`attention.kernels.invariant_cpu`):
bfloat16 pools on the CPU, where a C compiler builds it and it runs at the model's shapes,
under either numerics (it is invariant, and the fastest bfloat16 attention measured here:
`--fast-numerics` keeps it and drops only the linears' and norms' row tiling). Elsewhere
torch's flash kernel in probed blocks (`flash_blocks`), the block attention or, under fast
numerics, the step-shaped paths run, as before.

`ASTRAI_BATCH_CPU_KERNEL=0` keeps torch's flash kernel (a comparison, or a machine whose
compiler misbehaves); the build is cached per CPU kind under the cache root.
"""

from __future__ import annotations

import logging
import os

import torch

from astrai_batch.cache.kv_pool import KVPool
from astrai_batch.engine.attention.kernels.invariant_cpu import KernelUnavailable, load_kernel
from astrai_batch.engine.model.converted import cache_root

_LOG = logging.getLogger(__name__)
SWITCH_ENV_VAR = "ASTRAI_BATCH_CPU_KERNEL"


def cpu_attention(query_heads: int, pool: KVPool):
    """The C kernel's `attend` for this pool, or None (not a CPU bfloat16 pool, switched off,
    no compiler, or a failed trial run: the reason is logged)."""
    key, value = pool.key_cache[0], pool.value_cache[0]
    if key.device.type != "cpu" or key.dtype != torch.bfloat16:
        return None
    if os.environ.get(SWITCH_ENV_VAR, "1").strip() == "0":
        return None
    try:
        kernel = load_kernel(cache_root())
        q = torch.zeros(1, query_heads, key.shape[-1], dtype=key.dtype)
        one = torch.ones(1, dtype=torch.int32)
        tables = torch.zeros(1, 1, dtype=torch.int32)
        kernel.attend(q, key, value, tables, one - 1, one, pool.page_size, 1.0)
    except (KernelUnavailable, OSError, ValueError) as exc:
        _LOG.warning("the CPU attention kernel does not run here (%s); using torch's", exc)
        return None
    return kernel.attend
