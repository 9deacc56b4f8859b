"""Do the CUDA kernels build for a GPU? Compiled ahead of time, without one.

Invariant numerics on CUDA run Triton kernels (`invariant_triton`, `norm_triton`) that a GPU
compiles at their first launch. Triton compiles for any CUDA arch on any machine with its
bundled ptxas, so this compiles every variant the engine launches (bfloat16 and float32,
int32 eager and int64 graphed page tables and key counts, head sizes 64 and 128, with and
without softcapping and sinks, norm rows
of 576 and 8,192) for each arch given, and prints one JSON object: per variant whether it
built, the cubin's size, or the compiler's error. Exit 1 if any failed. Run it without
`TRITON_INTERPRET`.

    python -m astrai_batch.bench.kernel_builds --arch 80 90
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

ATTENTION_VARIANTS = {  # name: (dtype, head size, query heads per KV head, table/key ints,
    # softcapping and sinks: `score_features`)
    "attention-bfloat16-d64-eager": ("bf16", 64, 3, "i32", False),
    "attention-float32-d64-graphed": ("fp32", 64, 3, "i64", False),
    "attention-bfloat16-d128-graphed": ("bf16", 128, 4, "i64", False),
    "attention-bfloat16-d64-softcap-sinks": ("bf16", 64, 8, "i32", True),
}
NORM_WIDTHS = (576, 8192)


def build_all(archs: Sequence[int]) -> dict[str, dict]:
    from astrai_batch.engine.attention.kernels import invariant_triton
    from astrai_batch.engine.runner import norm_triton

    results = {}
    for arch in archs:
        for name, (dtype, head_dim, group, table, scored) in ATTENTION_VARIANTS.items():
            pad = max(invariant_triton.MIN_DOT, 1 << (head_dim - 1).bit_length())
            pointers = {
                **{arg: f"*{dtype}" for arg in ("q_ptr", "k_ptr", "v_ptr")},
                "out_ptr": "*fp32",
                "tables_ptr": f"*{table}",
                "token_table_ptr": "*i32",
                "token_keys_ptr": f"*{table}",  # graphs: positions + 1, int64
                "scale": "fp32",
                "sinks_ptr": "*fp32",
                "softcap": "fp32",
            }
            constexprs = dict(
                PAGE_SIZE=16,
                GROUP=group,
                GROUP_PAD=invariant_triton.MIN_DOT,
                HEAD_DIM=head_dim,
                DIM_PAD=pad,
                VALUE_DIM=head_dim,
                VALUE_PAD=pad,
                BLOCK=invariant_triton.KEY_BLOCK,
                IEEE=dtype == "fp32",
                SOFTCAP=scored,
                SINKS=scored,
            )
            kernel = invariant_triton._invariant_attention_kernel
            results[f"sm_{arch}/{name}"] = _build(kernel, pointers, constexprs, arch)
        for width in NORM_WIDTHS:
            constexprs = {"WIDTH": width, "BLOCK": 1 << (width - 1).bit_length()}
            pointers = {"x_ptr": "*fp32", "out_ptr": "*fp32"}
            kernel = norm_triton._mean_squares_kernel
            results[f"sm_{arch}/norm-{width}"] = _build(kernel, pointers, constexprs, arch)
    return results


def _build(kernel, pointers: dict, constexprs: dict, arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {
        name: pointers.get(name, "constexpr" if name in constexprs else "i32") for name in names
    }
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(name),): value for name, value in constexprs.items()},
    )
    try:
        compiled = triton.compile(
            source, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False}
        )
    except Exception as exc:  # the compiler's error, whatever its kind, is the finding
        return {"built": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"built": True, "cubin_bytes": len(compiled.asm["cubin"])}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="Compile the CUDA kernels for GPU archs.")
    parser.add_argument("--arch", type=int, nargs="+", default=[90])
    args = parser.parse_args(list(argv))
    results = build_all(args.arch)
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0 if all(result["built"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
