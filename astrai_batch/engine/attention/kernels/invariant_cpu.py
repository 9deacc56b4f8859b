"""Batch-invariant paged attention for the CPU in bfloat16: a small C kernel (`invariant_cpu.c`),
compiled on first use, one query token x one KV head at a time (a prefill chunk's tokens four
at a time: they share the loading of the keys both see, nothing of their arithmetic).

Why: under invariant numerics torch's CPU flash kernel can only be made invariant from outside
(`flash_blocks`): in bfloat16 each decode is then a kernel call over a whole 512-key block,
padded, masked and gathered out of the pages, and a shared prefix cannot be read once (each
extra block would add a rounding of the block's output to bfloat16 before the fold, which
transformers' one call does not have). This kernel fixes the order by construction instead,
as the CUDA kernel does (`invariant_triton`), with the arithmetic of transformers' own bfloat16
attention on the CPU (torch's flash kernel, one call per sequence):

- keys in splits of 512 from position 0; a split's scores are q . k in float32 (bfloat16
  products are exact in float32), times the scale; the running max over the split's scores;
  p = exp(score - max) summed in float32, then rounded to bfloat16 for p x V, as torch does
  before its bfloat16 GEMM; the running output rescaled by exp(old max - max) in float32;
  the output divided by the sum once, at the end, and rounded to bfloat16 once.
- What differs from torch: the order of float32 sums inside a dot product and over keys
  (16 partial sums, folded in a fixed tree) and the exponential's last bit; both are below a
  bfloat16 output's rounding except at ties, like the differences between torch's own BLAS
  back ends.

A token's walk depends on its own key count, window and image span only, and every operation
rounds in the order written (compiled with -ffp-contract=off, no fast-math), so its bits are
the same alone, in any crowd, as a decode or inside a prefill chunk after a preemption, and on
any CPU this compiles for. Sinks start the running max at the head's sink logit and add
exp(sink - max) to the sum at the end, as the CUDA kernel does. Softcapping is not here
(a softcapped model keeps the block attention).

The library is built with the system C compiler into the cache (`$ASTRAI_BATCH_CACHE/kernels`,
keyed by the source's hash and the compiler's target flags) and loaded with ctypes; where no
compiler works the runner keeps torch's flash kernel (`invariant_plan`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("invariant_cpu.c")
COMPILER_ENV_VAR = "CC"
# -fopenmp: the threads are torch's own OpenMP pool (the same libgomp, already loaded)
FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fopenmp",
    "-fPIC",
    "-shared",
)
MAX_GROUP = 64  # query heads per KV head (the C source's limits)
MAX_DIM = 256  # head size


class KernelUnavailable(RuntimeError):
    """No C compiler, or the build failed: the caller keeps torch's flash kernel."""


class _Job(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("q_token", ctypes.c_int64),
        ("q_head", ctypes.c_int64),
        ("k", ctypes.c_void_p),
        ("k_slot", ctypes.c_int64),
        ("k_head", ctypes.c_int64),
        ("v", ctypes.c_void_p),
        ("v_slot", ctypes.c_int64),
        ("v_head", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("o_token", ctypes.c_int64),
        ("o_head", ctypes.c_int64),
        ("tables", ctypes.c_void_p),
        ("table_stride", ctypes.c_int64),
        ("table_rows", ctypes.c_int64),
        ("table_width", ctypes.c_int64),
        ("slots", ctypes.c_int64),
        ("token_table", ctypes.c_void_p),
        ("token_keys", ctypes.c_void_p),
        ("key_ends", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("tokens", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("group", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("value_dim", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("window", ctypes.c_int64),
        ("scale", ctypes.c_float),
    ]


class CpuKernel:
    """The loaded library; `attend` has the CUDA kernel's signature (`invariant_triton`)."""

    def __init__(self, library: ctypes.CDLL):
        self._run = library.invariant_attention_bf16
        self._run.argtypes = [ctypes.POINTER(_Job), ctypes.c_int]
        self._run.restype = ctypes.c_int
        if library.job_size() != ctypes.sizeof(_Job):
            raise KernelUnavailable("the kernel's job layout does not match its loader")

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        token_table: torch.Tensor,
        token_keys: torch.Tensor,
        page_size: int,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        key_ends: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D] -> [T, Hq, Dv] bfloat16. Token t attends to keys [0, token_keys[t])
        of the sequence whose pages are row `token_table[t]` of `tables`, or to
        [0, key_ends[t]) where given (an image's tokens see the whole image); a sliding
        window hides keys at positions <= token_keys[t] - 1 - window."""
        if softcap is not None:
            raise ValueError("the CPU invariant attention kernel cannot apply softcapping")
        for name, t in (("queries", q), ("keys", k_cache), ("values", v_cache)):
            if t.dtype != torch.bfloat16 or t.device.type != "cpu":
                raise ValueError(f"the CPU invariant attention kernel needs CPU bfloat16 {name}")
        num_tokens, q_heads, value_dim = q.shape[0], q.shape[1], v_cache.shape[-1]
        q = q if q.stride(-1) == 1 else q.contiguous()
        for t in (k_cache, v_cache):
            if t.stride(-1) != 1:
                raise ValueError("the KV pool's head dimension must be contiguous")
        out = torch.empty(num_tokens, q_heads, value_dim, dtype=torch.bfloat16)
        if num_tokens == 0:
            return out
        step = KernelStep(self._run, tables, token_table, token_keys, page_size, key_ends, sinks)
        step.run(q, k_cache, v_cache, out, scale, window, torch.get_num_threads())
        return out

    def step(
        self,
        tables: torch.Tensor,
        token_table: torch.Tensor,
        token_keys: torch.Tensor,
        page_size: int,
        key_ends: torch.Tensor | None = None,
    ) -> KernelStep:
        """The kernel's call for one step, its index arrays (as `attend` takes them) bound
        once: each layer then gives only its queries, pools and output (`KernelStep`)."""
        return KernelStep(self._run, tables, token_table, token_keys, page_size, key_ends)


class KernelStep:
    """`CpuKernel.attend` for one step's tokens with the per-step fields of its job filled
    once (`runner.direct_layer` calls it for each of a model's layers; `attend` for one)."""

    def __init__(self, run, tables, token_table, token_keys, page_size, key_ends, sinks=None):
        arrays = [_int32(tables), _int32(token_table), _int32(token_keys)]
        ends = None if key_ends is None else _int32(key_ends)
        sink_logits = None if sinks is None else sinks.detach().float().contiguous()
        self._run = run
        # the job points into these: they live as long as it
        self._arrays = (*arrays, ends, sink_logits)
        self.tokens = arrays[1].shape[0]
        job = self._job = _Job()
        job.tables, job.table_stride = arrays[0].data_ptr(), arrays[0].stride(0)
        job.table_rows, job.table_width = arrays[0].shape
        job.token_table, job.token_keys = arrays[1].data_ptr(), arrays[2].data_ptr()
        job.key_ends = None if ends is None else ends.data_ptr()
        job.sinks = None if sink_logits is None else sink_logits.data_ptr()
        job.page_size = page_size

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        window: int | None,
        threads: int,
    ) -> None:
        """`CpuKernel.attend` into `out` [T, Hq, Dv] for q [T, Hq, D] (both contiguous CPU
        bfloat16, T this step's tokens) over pools whose head dimension is contiguous."""
        tokens, q_heads = q.shape[0], q.shape[1]
        if tokens != self.tokens or out.shape != (tokens, q_heads, v_cache.shape[-1]):
            raise ValueError("the CPU attention kernel's step has other tokens or outputs")
        for t in (q, k_cache, v_cache, out):  # what the C side reads and writes, never misread
            if t.dtype != torch.bfloat16 or t.device.type != "cpu" or t.stride(-1) != 1:
                raise ValueError("the CPU attention kernel's step needs CPU bfloat16 rows")
        if not (q.is_contiguous() and out.is_contiguous()):
            raise ValueError("the CPU attention kernel's step needs contiguous queries and output")
        self.run(q, k_cache, v_cache, out, scale, window, threads)

    def run(self, q, k_cache, v_cache, out, scale: float, window: int | None, threads: int):
        """The call itself, on tensors checked by the caller (CPU bfloat16, each with its
        last dimension contiguous): q's rows are the job's tokens."""
        tokens, q_heads, head_dim = q.shape
        kv_heads, value_dim = k_cache.shape[1], v_cache.shape[-1]
        job = self._job
        job.q, job.q_token, job.q_head = q.data_ptr(), q.stride(0), q.stride(1)
        job.k, job.k_slot, job.k_head = k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1)
        job.v, job.v_slot, job.v_head = v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1)
        job.out, job.o_token, job.o_head = out.data_ptr(), out.stride(0), out.stride(1)
        job.slots = min(k_cache.shape[0], v_cache.shape[0])
        job.tokens, job.kv_heads, job.group = tokens, kv_heads, q_heads // kv_heads
        job.head_dim, job.value_dim = head_dim, value_dim
        job.window, job.scale = 0 if window is None else int(window), float(scale)
        _check_status(self._run(ctypes.byref(job), threads), head_dim, value_dim, job.group)


def _check_status(status: int, head_dim: int, value_dim: int, group: int) -> None:
    if status == -1:
        raise ValueError(
            f"the CPU invariant attention kernel takes head sizes up to {MAX_DIM} and up to "
            f"{MAX_GROUP} query heads per KV head, got {head_dim}/{value_dim} and {group}"
        )
    if status == -3:
        raise IndexError("a query token's page table row or pages lie outside the pool")
    if status != 0:
        raise MemoryError("the CPU invariant attention kernel found no memory for its scratch")


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32).contiguous()


def library_path(cache: Path, flags: tuple[str, ...] = FLAGS, source: Path = SOURCE) -> Path:
    """Where the build for this source, compiler, flags and CPU lives."""
    compiler = _compiler()
    target = [f for f in flags if f.startswith("-march=")] or ["-march=native"]
    probe = subprocess.run(
        [compiler, *target, "-Q", "--help=target"], capture_output=True, text=True, check=False
    )
    key = hashlib.sha256()
    for part in (source.read_bytes(), compiler.encode(), " ".join(flags).encode()):
        key.update(part)
    key.update(probe.stdout.encode())  # the target's features: a build per kind of CPU
    return cache / "kernels" / f"{source.stem}-{key.hexdigest()[:16]}.so"


def _compiler() -> str:
    name = os.environ.get(COMPILER_ENV_VAR) or "cc"
    found = shutil.which(name)
    if found is None:
        raise KernelUnavailable(f"no C compiler ({name}) to build the CPU attention kernel")
    return found


def build(cache: Path, flags: tuple[str, ...] = FLAGS, source: Path = SOURCE) -> Path:
    """The compiled library, built once (a temporary file renamed into place). `flags`: the
    tests build the portable code too (`-march=x86-64-v3`) to compare its bits; `source`:
    another C file built the same way (the decoder layer's kernels, `runner.layer_kernels`)."""
    target = library_path(cache, flags, source)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        command = [_compiler(), *flags, "-o", str(partial), str(source)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KernelUnavailable(f"building {source.name} failed: {done.stderr.strip()[:500]}")
        os.replace(partial, target)
    return target


def load_kernel(cache: Path, flags: tuple[str, ...] = FLAGS) -> CpuKernel:
    """The kernel, built into `cache` if it is not there yet (raises `KernelUnavailable`)."""
    return CpuKernel(ctypes.CDLL(str(build(cache, flags))))
