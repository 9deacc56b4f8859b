"""A decoder layer's norms, rotary embedding, MLP activation and KV pool writes on the CPU in
bfloat16, each one C call (`layer_cpu.c`) in place of the torch operators transformers runs.

Why: at a decode step's 64 rows these operators are tiny, and their dispatch is the cost
(SmolLM2: a norm 8 operators, the rotary embedding 12, ~10 us each, 30 layers a step).

They must change no bit: `layer_checks.norm_matches` and `rotary_matches` compare them with
transformers' own module and function on adversarial rows before a model uses them
(`fused_layers`), and `activation_table` takes torch's own activation at every bfloat16
value. `DirectCalls` are the same calls on rows checked once (`direct_layer`). The
elementwise steps round where torch's operators round; the norm's one reduction, a row's sum
of squares, follows torch's CPU sum kernel (its vectors' width is the one thing that varies
with the CPU torch dispatches for, so the check tries the widths torch's kernels use and keeps
the one that matches, or none).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple

import torch

from astrai_batch.engine.attention.kernels.invariant_cpu import KernelUnavailable, build

SOURCE = Path(__file__).with_name("layer_cpu.c")
# float lanes of torch's CPU vectors, the likeliest first: AVX2 (measured: torch 2.13 sums with
# its AVX2 kernel on an AVX-512 Zen 5 too), AVX-512, NEON
LANES = (8, 16, 4)

_ptr = ctypes.c_void_p
_i64 = ctypes.c_int64


class PoolWrite(NamedTuple):
    """A step's keys (once rotated) and values bound for the attention kernel's pools: token
    t's row to slot `slots[t]` of each (`takes_rows` holds for both)."""

    key_pool: torch.Tensor
    value_pool: torch.Tensor
    slots: torch.Tensor  # [T] int64
    values: torch.Tensor  # the step's values, T rows of a token's heads side by side


class _PoolWrite(ctypes.Structure):
    _fields_ = [
        ("k_pool", _ptr),
        ("v_pool", _ptr),
        ("k_slot", _i64),
        ("v_slot", _i64),
        ("pool_slots", _i64),
        ("v", _ptr),
        ("v_row", _i64),
        ("v_width", _i64),
        ("slots", _ptr),
    ]


class LayerKernels:
    """The loaded library's entry points, on torch tensors."""

    def __init__(self, library: ctypes.CDLL):
        self._norm = library.rms_norm_bf16
        self._norm.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64]
        self._norm.argtypes += [_i64, _i64, ctypes.c_float, ctypes.c_int, ctypes.c_int]
        self._norm.restype = ctypes.c_int
        self._rotary = library.rotary_bf16
        self._rotary.argtypes = [_ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64]
        self._rotary.argtypes += [_i64, _i64, _i64, _i64, ctypes.POINTER(_PoolWrite), ctypes.c_int]
        self._rotary.restype = ctypes.c_int
        if library.pool_write_size() != ctypes.sizeof(_PoolWrite):
            raise KernelUnavailable("the layer kernels' pool write layout does not match")
        self._act_mul = library.act_mul_bf16
        self._act_mul.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64, _i64, ctypes.c_int]
        self._act_mul.restype = ctypes.c_int
        self._means = library.mean_squares_bf16
        self._means.argtypes = [_ptr, _i64, _ptr, _i64, _i64, ctypes.c_int]
        self._means.restype = ctypes.c_int
        self.direct = DirectCalls(self)  # the calls themselves, which the methods below check

    def mean_squares(self, x: torch.Tensor, lanes: int) -> torch.Tensor:
        """float32 mean of each row's squares (the norm's reduction alone), [rows]."""
        rows = _rows(x, x.shape[-1])
        out = torch.empty(rows.shape[0], dtype=torch.float32)
        status = self._means(rows.data_ptr(), rows.stride(0), out.data_ptr(), *rows.shape, lanes)
        _norm_status(status, lanes)
        return out

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        lanes: int,
        add: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(s), s) with s = x + add (or x), rows of the last dimension, bfloat16."""
        _bfloat16("norm", x, weight, *(() if add is None else (add,)))
        width = x.shape[-1]
        if weight.shape != (width,) or (add is not None and add.shape != x.shape):
            raise ValueError("the CPU norm kernel needs a weight and an addend of the rows' shape")
        rows = _rows(x, width)
        threads = torch.get_num_threads()
        if add is None:
            return self.direct.norm(rows, weight, eps, lanes, threads).view(x.shape), x
        out, total = self.direct.norm(rows, weight, eps, lanes, threads, add=_rows(add, width))
        return out.view(x.shape), total.view(x.shape)

    def rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        dim: int,
        pools: PoolWrite | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [T, Hq * dim] and keys [T, Hk * dim] rotated by cos/sin [T, dim]:
        [T, Hq, dim] and [T, Hk, dim], contiguous, bfloat16. With `pools`, the rotated keys
        and the values are written into their slots as well (`index_copy_`'s result)."""
        _bfloat16("rotary", q, k, cos, sin)
        tokens = q.shape[0]
        q_heads, k_heads = q.shape[1] // dim, k.shape[1] // dim
        if k.shape[0] != tokens or cos.numel() != tokens * dim or sin.numel() != tokens * dim:
            raise ValueError("the CPU rotary kernel needs one row of angles per token")
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            q, k = q.contiguous(), k.contiguous()
        q_out = torch.empty(tokens, q_heads, dim, dtype=torch.bfloat16)
        k_out = torch.empty(tokens, k_heads, dim, dtype=torch.bfloat16)
        cos, sin = _rows(cos, dim), _rows(sin, dim)
        if sin.stride(0) != cos.stride(0):
            sin = sin.contiguous()
            cos = cos.contiguous()
        write = None if pools is None else _pool_write(pools, tokens, k_heads * dim)
        status = self._rotary(
            q.data_ptr(), q.stride(0), q_out.data_ptr(),
            k.data_ptr(), k.stride(0), k_out.data_ptr(),
            cos.data_ptr(), sin.data_ptr(), cos.stride(0),
            tokens, q_heads, k_heads, dim,
            None if write is None else ctypes.byref(write[0]), torch.get_num_threads(),
        )  # fmt: skip
        _rotary_status(status, dim)
        return q_out, k_out

    def act_mul(self, gate: torch.Tensor, up: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """`act(gate) * up` in bfloat16, `table` the activation of every bfloat16 value
        (`activation_table`, float32), indexed by the value's bits."""
        _bfloat16("activation", gate, up)
        if gate.shape != up.shape or table.dtype != torch.float32 or table.numel() != 65536:
            raise ValueError("the CPU activation kernel needs gate and up of one shape")
        width = gate.shape[-1]
        g, u = _rows(gate, width), _rows(up, width)
        return self.direct.act_mul(g, u, table, torch.get_num_threads()).view(gate.shape)


class DirectCalls:
    """The layer kernels' calls on rows already checked (`LayerKernels`' methods check them
    each call; `runner.direct_layer` once a step or a layer): outputs allocated, pointers
    passed, statuses raised. `rows` are [T, width] CPU bfloat16 tensors, each row contiguous."""

    def __init__(self, kernels: LayerKernels):
        self._norm, self._rotary = kernels._norm, kernels._rotary
        self._act_mul = kernels._act_mul
        self._write = _PoolWrite()

    def norm(self, rows, weight, eps: float, lanes: int, threads: int, add=None):
        """`LayerKernels.rms_norm` of rows: the norm, and with `add` (norm, rows + add)."""
        tokens, width = rows.shape
        if weight.shape != (width,) or weight.dtype != torch.bfloat16:
            raise ValueError("the CPU norm kernel needs a bfloat16 weight of the rows' width")
        out = torch.empty(tokens, width, dtype=torch.bfloat16)
        total = out if add is None else torch.empty(tokens, width, dtype=torch.bfloat16)
        status = self._norm(
            rows.data_ptr(), rows.stride(0),
            None if add is None else add.data_ptr(), 0 if add is None else add.stride(0),
            None if add is None else total.data_ptr(), width,
            weight.data_ptr(), out.data_ptr(), width, tokens, width, eps, lanes, threads,
        )  # fmt: skip
        _norm_status(status, lanes)
        return out if add is None else (out, total)

    def rotary_into_pools(self, projected, widths, cos, sin, dim, pools, slots, threads):
        """`LayerKernels.rotary` of the queries and keys in `projected`'s rows
        ([T, q | k | v], `widths` = (q, k) columns), writing the rotated keys and the values
        into `pools` (key pool, value pool: a slot one contiguous row of the width of a
        token's keys and of its values) at `slots` ([T] int64, contiguous); returns the
        rotated queries [T, Hq, dim]. cos/sin: [T, dim] contiguous rows."""
        tokens, columns = projected.shape
        q_width, k_width = widths
        k_pool, v_pool = pools
        if k_pool[0].numel() != k_width or v_pool[0].numel() != columns - q_width - k_width:
            raise ValueError("the KV pools cannot take this step's rows")
        q_out = torch.empty(tokens, q_width // dim, dim, dtype=torch.bfloat16)
        k_out = torch.empty(tokens, k_width // dim, dim, dtype=torch.bfloat16)
        start, size = projected.data_ptr(), projected.element_size()
        write = self._write
        write.k_pool, write.v_pool = k_pool.data_ptr(), v_pool.data_ptr()
        write.k_slot, write.v_slot = k_pool.stride(0), v_pool.stride(0)
        write.pool_slots = min(k_pool.shape[0], v_pool.shape[0])
        write.v, write.v_row = start + (q_width + k_width) * size, columns
        write.v_width, write.slots = v_pool[0].numel(), slots.data_ptr()
        status = self._rotary(
            start, columns, q_out.data_ptr(), start + q_width * size, columns, k_out.data_ptr(),
            cos.data_ptr(), sin.data_ptr(), dim, tokens, q_width // dim, k_width // dim, dim,
            ctypes.byref(write), threads,
        )  # fmt: skip
        _rotary_status(status, dim)
        return q_out

    def act_mul(self, gate, up, table, threads: int):
        """`LayerKernels.act_mul` of rows of gate and up [T, width]."""
        tokens, width = gate.shape
        out = torch.empty(tokens, width, dtype=torch.bfloat16)
        self._act_mul(
            gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), table.data_ptr(),
            out.data_ptr(), tokens, width, threads,
        )  # fmt: skip
        return out


def takes_rows(pool: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> bool:
    """Whether `rotary` can write `rows` (a token's values side by side) into `pool`:
    bfloat16 both, each slot one contiguous row of a token's elements, int64 slots."""
    return (
        pool.dtype == rows.dtype == torch.bfloat16
        and pool.dim() >= 2
        and pool[0].is_contiguous()
        and rows.numel() == slots.numel() * pool[0].numel()
        and slots.dtype == torch.int64
        and slots.dim() == 1
        and slots.is_contiguous()
    )


def _pool_write(pools: PoolWrite, tokens: int, key_width: int):
    """The C side's view of `pools` (with the tensors it points into, kept alive), or a
    ValueError where a pool cannot take the step's rows."""
    k_pool, v_pool, slots, values = pools
    keys_fit = (
        k_pool.dtype == torch.bfloat16
        and k_pool.dim() >= 2
        and k_pool[0].is_contiguous()
        and k_pool[0].numel() == key_width
        and slots.numel() == tokens
    )
    if not (keys_fit and takes_rows(v_pool, values, slots)):
        raise ValueError("the KV pools cannot take this step's rows")
    v_width = v_pool[0].numel()
    rows = _rows(values, v_width)
    write = _PoolWrite(
        k_pool.data_ptr(), v_pool.data_ptr(), k_pool.stride(0), v_pool.stride(0),
        min(k_pool.shape[0], v_pool.shape[0]), rows.data_ptr(), rows.stride(0), v_width,
        slots.data_ptr(),
    )  # fmt: skip
    return write, rows


def _norm_status(status: int, lanes: int) -> None:
    if status == -2:
        raise MemoryError("the CPU norm kernel found no memory for its scratch")
    if status != 0:
        raise ValueError(f"the CPU norm kernel sums vectors of 1-16 floats, not {lanes}")


def _rotary_status(status: int, dim: int) -> None:
    if status == -3:
        raise IndexError("a step's write slot lies outside the KV pool")
    if status != 0:
        raise ValueError(f"the CPU rotary kernel takes even head sizes, got {dim}")


def _bfloat16(kernel: str, *tensors: torch.Tensor) -> None:
    """The C kernels read CPU bfloat16 memory: anything else is refused, never misread."""
    for t in tensors:
        if t.dtype != torch.bfloat16 or t.device.type != "cpu":
            raise ValueError(f"the CPU {kernel} kernel needs CPU bfloat16 tensors, got {t.dtype}")


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` as [rows, width] with contiguous rows (a view where it can be)."""
    rows = t.reshape(-1, width)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def load_layer_kernels(cache: Path) -> LayerKernels:
    """The kernels, built into `cache` if not there yet (raises `KernelUnavailable`)."""
    return LayerKernels(ctypes.CDLL(str(build(cache, source=SOURCE))))
