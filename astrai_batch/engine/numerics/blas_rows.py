"""Which GEMM row counts give a row the same bits whatever the count: a probe of the BLAS.

A CPU BLAS sums a row's K products in an order set by its K blocking, which does not depend
on M, the row count, except where M is small: MKL (torch's CPU BLAS, measured on AMD Zen 4)
computes the trailing rows of M = 1-3, 5-7 and 9-11 with other micro-kernels, and every row
of every M >= 12 (and of M = 4, 8) equals the same row inside M = 2048, at any position.
Another BLAS or CPU may differ, so the engine measures it at start, on the model's own K x N
shapes, and picks the cheapest invariant scheme (`RowScheme`): small steps padded to the
next invariant M, one GEMM for the rest; tiles of one invariant M if large M are not
invariant; none (the engine refuses invariant numerics) when no M is.

The probe samples M (every M up to `SMALL_ROWS`, then a spread up to `max_rows`) and, for
each, the rows at several offsets of one random matrix (a row block may depend on its
position), against the rows of one `max_rows`-row GEMM. `scripts/probe_blas_rows.py` runs
the exhaustive sweep (every M from 1 to 2048).

bfloat16 and float16 GEMMs go to oneDNN's AMX / AVX-512 brgemm kernels, which block K and
split the work among threads by M. Whether that leaves an M range to trust depends on the
kernel: measured on a Sapphire Rapids Xeon (AMX; torch 2.13, oneDNN 3.12, 2 threads), the rows
of K x N 1536 x 576 agree with a 520-row GEMM for M = 37-255, 417-422, 449-459 and 481-505 and
nowhere else, and a 49152-column LM head has other ranges than its first 768 columns; on an
AMD Zen 4 (AVX-512 BF16, no AMX) every M from 2 to 1,024 agrees, for every shape of SmolLM2.
So those dtypes are probed per shape at its full width: first for a range, as float32 is (one
GEMM per step; tiles cost 1.25-2.5x one GEMM on a 1,024-row prefill on that Zen 4,
`docs/performance.md`), and where none holds, every GEMM runs exactly one tile of T rows
(`probe_tile_scheme`: fixed shape, fixed kernel and thread split); a row's place inside the
tile must not matter, and a short remainder pads to a smaller probed size only where that one
agrees. Their probe data is adversarial (`adversarial_rows`): a bf16 output hides most
reorderings of an fp32 sum in its rounding (random data showed one differing element in
24,576), so its rows carry large products that cancel, and any other summation order shows
in the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai_batch.errors import NumericsUnavailableError

Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]

SMALL_ROWS = 32  # every M up to this is probed: the small-M paths live here
LARGE_ROWS = (33, 64, 100, 127, 128, 129, 255, 300, 511)
PROBE_COLUMNS = 768  # wider outputs are probed on this many (a row's sum runs over K)
DEFAULT_MAX_ROWS = 512  # steps with more rows run in GEMMs of this many
# tile sizes for the reduced-precision GEMMs, preferred first: 64 is a decode step of 64
# sequences in one GEMM and a 512-token prefill chunk in 8; each weight matrix of a small
# model fits in L2, so the tiles re-read it from there
TILE_ROWS = (64, 128, 32, 16)
PAD_ROWS = (2, 4, 8, 16, 32)  # smaller GEMMs a short remainder may run in, where probed
Shape = tuple[int, int, bool]  # in features K, out features N, bias
WHOLE_ROWS = 1 << 62  # `RowScheme.whole`: no step is larger


def plain_gemm(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The GEMM the invariant linear layers run (and the probe measures): 2-D `F.linear`."""
    return F.linear(rows, weight, bias)


@dataclass(frozen=True)
class RowScheme:
    """How a linear layer runs M rows so that each row's bits never depend on M.

    M < `min_rows`: padded with zero rows to `pad_to[M]`; `min_rows` <= M <= `max_rows`: one
    GEMM; larger: GEMMs of `max_rows` rows, a remainder below `min_rows` padded.
    Tiles (`min_rows == max_rows`) are the fallback where large M are not invariant.
    """

    min_rows: int
    max_rows: int
    pad_to: tuple[int, ...]  # pad_to[m] for 1 <= m < min_rows; index 0 unused

    def __post_init__(self) -> None:
        if not 1 <= self.min_rows <= self.max_rows:
            raise ValueError(f"need 1 <= min_rows <= max_rows, got {self}")
        if len(self.pad_to) != self.min_rows:
            raise ValueError(f"pad_to needs {self.min_rows} entries, got {len(self.pad_to)}")

    @classmethod
    def whole(cls) -> RowScheme:
        """Every step's rows in one GEMM, as a plain linear layer runs them (fast numerics'
        packed layers: `packed_gemm`)."""
        return cls(min_rows=1, max_rows=WHOLE_ROWS, pad_to=(0,))

    @classmethod
    def tiles(cls, rows: int) -> RowScheme:
        """Every GEMM exactly `rows` rows (the last padded): the scheme before the probe."""
        return cls(min_rows=rows, max_rows=rows, pad_to=(0, *[rows] * (rows - 1)))

    def describe(self) -> str:
        if self.max_rows == WHOLE_ROWS:
            return "one GEMM"
        if self.min_rows == self.max_rows:
            return f"tiles of {self.max_rows} rows"
        if self.min_rows == 1:
            return f"one GEMM up to {self.max_rows} rows"
        return (
            f"M < {self.min_rows} padded to {sorted(set(self.pad_to[1:]))}, "
            f"one GEMM up to {self.max_rows} rows"
        )


def probe_row_scheme(
    shapes: Iterable[tuple[int, int, bool]],
    max_rows: int = DEFAULT_MAX_ROWS,
    gemm: Gemm = plain_gemm,
    dtype: torch.dtype = torch.float32,
) -> RowScheme:
    """The cheapest invariant scheme for every (in features K, out features N, bias) shape.

    Raises NumericsUnavailableError when no probed M gives a row the same bits everywhere.
    """
    candidates = _candidates(max_rows)
    valid = set(candidates)
    generator = torch.Generator().manual_seed(25)
    shapes = sorted({(k, min(n, PROBE_COLUMNS), bias) for k, n, bias in shapes})
    for k, n, bias in shapes:
        valid &= _invariant_row_counts(k, n, bias, candidates, max_rows, gemm, generator, dtype)
    if not valid:
        first = shapes[0] if shapes else (0, 0, False)
        raise NumericsUnavailableError(
            f"batch-invariant numerics are unavailable here: torch {torch.__version__}'s BLAS "
            f"gives no GEMM row count whose rows are independent of it (K x N {first[0]} x "
            f"{first[1]}); run with --fast-numerics"
        )
    return _range_scheme(candidates, valid, max_rows) or RowScheme.tiles(max(valid))


def _candidates(max_rows: int) -> list[int]:
    candidates = sorted({*range(1, SMALL_ROWS + 1), *LARGE_ROWS, max_rows} - {0})
    return [m for m in candidates if m <= max_rows]


def _range_scheme(candidates: list[int], valid: set[int], max_rows: int) -> RowScheme | None:
    """Small M padded, one GEMM from the smallest M on which every probed M is invariant up
    to `max_rows`; None where no such range reaches `max_rows`."""
    min_rows = next((m for m in candidates if all(c in valid for c in candidates if c >= m)), None)
    if min_rows is None or max_rows not in valid:
        return None
    pad_to = [0]
    for m in range(1, min_rows):
        pad_to.append(min(c for c in valid if c >= m))
    return RowScheme(min_rows=min_rows, max_rows=max_rows, pad_to=tuple(pad_to))


def probe_row_schemes(
    shapes: Iterable[Shape],
    max_rows: int = DEFAULT_MAX_ROWS,
    gemm: Gemm = plain_gemm,
    dtype: torch.dtype = torch.float32,
) -> dict[Shape, RowScheme]:
    """A scheme per shape: float32's one scheme for all (`probe_row_scheme`), or in a
    reduced precision each shape's own fixed tiles (`probe_tile_scheme`)."""
    shapes = sorted(set(shapes))
    if dtype == torch.float32:
        scheme = probe_row_scheme(shapes, max_rows, gemm, dtype)
        return {shape: scheme for shape in shapes}
    generator = torch.Generator().manual_seed(25)
    return {shape: _reduced_scheme(*shape, max_rows, gemm, dtype, generator) for shape in shapes}


def _reduced_scheme(k, n, bias, max_rows, gemm, dtype, generator) -> RowScheme:
    """A range (small M padded, one GEMM up to `max_rows`) where the kernel keeps a row's
    bits at every probed M on adversarial data and small steps pad to at most a tile's size:
    every candidate M on `PROBE_COLUMNS` columns, then the M the scheme runs and a spread of
    large ones again at the full width (a wide LM head's later columns may differ, and a
    probe of every M at 49,152 columns takes seconds); else fixed tiles
    (`probe_tile_scheme`)."""
    candidates = _candidates(max_rows)
    valid = _invariant_row_counts(
        k, min(n, PROBE_COLUMNS), bias, candidates, max_rows, gemm, generator, dtype, True
    )
    scheme = _range_scheme(candidates, valid, max_rows)
    if scheme is not None and scheme.min_rows <= TILE_ROWS[0]:
        if n <= PROBE_COLUMNS:
            return scheme
        low, high = scheme.min_rows, max_rows
        spread = [m for m in (low, 33, 129, high) if low <= m <= high]
        runs = sorted({*scheme.pad_to[1:], *spread})
        full = _invariant_row_counts(k, n, bias, runs, max_rows, gemm, generator, dtype, True)
        if full == set(runs):
            return scheme
    return probe_tile_scheme(k, n, bias, gemm, dtype, generator)


def probe_tile_scheme(
    k: int, n: int, bias: bool, gemm: Gemm, dtype: torch.dtype, generator: torch.Generator
) -> RowScheme:
    """Tiles of the first `TILE_ROWS` size whose rows keep their bits wherever they sit in
    the tile (rolled by several offsets), at the full K x N; a remainder of m rows pads to
    the smallest `PAD_ROWS` size >= m whose rows equal the same rows of the tile, else to
    the tile. Raises NumericsUnavailableError when no tile size keeps a row's bits."""
    weight = torch.randn(n, k, generator=generator)
    weight[:, ::8] = 64.0  # against `adversarial_rows` rows: products of +-4096 that cancel
    weight = weight.to(dtype)
    b = torch.randn(n, generator=generator).to(dtype) if bias else None
    for tile in TILE_ROWS:
        a = adversarial_rows(tile, k, generator).to(dtype)
        with torch.inference_mode():
            reference = gemm(a, weight, b)
            shifts = (1, tile // 2 + 3, tile - 1)
            if not all(
                torch.equal(gemm(a.roll(s, 0), weight, b), reference.roll(s, 0)) for s in shifts
            ):
                continue
            pads = [
                p
                for p in PAD_ROWS
                if p < tile
                and all(
                    torch.equal(gemm(a[o : o + p], weight, b), reference[o : o + p])
                    for o in (0, tile - p)
                )
            ]
        pad_to = [0] + [min((p for p in pads if p >= m), default=tile) for m in range(1, tile)]
        return RowScheme(min_rows=tile, max_rows=tile, pad_to=tuple(pad_to))
    raise NumericsUnavailableError(
        f"batch-invariant numerics are unavailable here: torch {torch.__version__}'s "
        f"{str(dtype).removeprefix('torch.')} GEMM gives no tile of "
        f"{', '.join(map(str, TILE_ROWS))} rows whose rows are independent of their place "
        f"in it (K x N {k} x {n}); run with --fast-numerics"
    )


def adversarial_rows(rows: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """Normal values with every 8th column at +-64 in balanced signs (exact in bf16): against
    a weight of 64s in those columns, a row's products of 4096 cancel, so the small products
    added while a partial sum is large round by the order they are added in."""
    x = torch.randn(rows, k, generator=generator)
    big = torch.arange(0, k, 8)
    signs = torch.ones(rows, len(big))
    signs[:, 1::2] = -1
    order = torch.argsort(torch.rand(rows, len(big), generator=generator), dim=1)
    x[:, big] = 64.0 * torch.gather(signs, 1, order)
    return x


def _invariant_row_counts(
    k, n, bias, candidates, max_rows, gemm, generator, dtype, adversarial=False
) -> set[int]:
    """The candidate M whose every row, at every probed offset, equals that row inside one
    `max_rows + spread`-row GEMM (on `adversarial_rows` data, and at two offsets for large M,
    where `adversarial`)."""
    spread = 8
    total = max_rows + spread
    weight = torch.randn(n, k, generator=generator)
    if adversarial:
        weight[:, ::8] = 64.0
        a = adversarial_rows(total, k, generator)
    weight = weight.to(dtype)
    b = torch.randn(n, generator=generator).to(dtype) if bias else None
    if not adversarial:  # drawn after the bias: float32's probe data as it always was
        a = torch.randn(total, k, generator=generator)
    a = a.to(dtype)
    with torch.inference_mode():
        reference = gemm(a, weight, b)
        valid = set()
        for m in candidates:
            # rows land at other positions than in the reference: a row block's position
            # is checked with its count
            if m <= SMALL_ROWS:
                offsets = {0, 1, total - m}
            else:
                offsets = {1, total - m} if adversarial else {total - m}
            if all(
                torch.equal(gemm(a[o : o + m], weight, b), reference[o : o + m]) for o in offsets
            ):
                valid.add(m)
    return valid


def linear_shapes(model: torch.nn.Module, min_columns: int = 1) -> list[tuple[int, int, bool]]:
    """(in features, out features, has bias) of every plain `nn.Linear` of `model`; outputs
    narrower than `min_columns` counted at that width (how the invariant layers run them)."""
    return sorted(
        {
            (m.in_features, max(m.out_features, min_columns), m.bias is not None)
            for m in model.modules()
            if type(m) is torch.nn.Linear
        }
    )


# Where no probe runs (off the CPU): only one-row GEMMs avoided (the matrix-vector path)
ROWS_AT_LEAST_TWO = RowScheme(min_rows=2, max_rows=1 << 30, pad_to=(0, 2))


def attention_row_scheme(
    head_dim: int, value_dim: int, block: int, max_rows: int, device: torch.device, dtype
) -> RowScheme:
    """The scheme for the block attention's GEMMs: scores reduce over one head (K = head_dim,
    N = block), probabilities x values over one block (K = block, N = value_dim)."""
    if device.type != "cpu":
        return ROWS_AT_LEAST_TWO
    shapes = [(head_dim, block, False), (block, value_dim, False)]
    return probe_row_scheme(shapes, max_rows, plain_gemm, dtype)


def pad_gemm_rows(x: torch.Tensor, scheme: RowScheme) -> torch.Tensor:
    """Pads the GEMM row axis (-2) with zero rows to the scheme's size for it, when small."""
    rows = x.shape[-2]
    if rows >= scheme.min_rows:
        return x
    shape = list(x.shape)
    shape[-2] = scheme.pad_to[rows] - rows
    return torch.cat([x, x.new_zeros(shape)], dim=-2)
