/* A decoder layer's elementwise work for the CPU in bfloat16, each in one pass and with the
 * bits of the torch operators it replaces (why and how they are checked: fused_layers.py).
 *
 * - rms_norm: the Llama family's RMSNorm, optionally after the residual add
 *   (`s = r + x; weight * (s * rsqrt(mean(s^2) + eps)).to(bf16)`), each rounding where torch
 *   rounds; the row's sum of squares in the order of torch's CPU sum kernel for a contiguous
 *   row (`lanes` wide vectors, four interleaved accumulators, a cascade of levels).
 * - rotary: `x * cos + rotate_half(x) * sin` for the queries and keys, every product and the
 *   sum rounded to bfloat16 as torch's three bfloat16 operators do.
 * - act_mul: `act(gate) * up`, the activation read from a table of its 65,536 bfloat16 values
 *   that torch's own activation computed (held widened to float32, exactly).
 *   Where asked, the rotated keys and the values go into their KV pool slots in the same
 *   pass (torch's index_copy_ costs ~30 us a call at a decode step's 64 rows; this is a
 *   memcpy a row, on the threads the rotation runs on).
 *
 * Built with -ffp-contract=off and without -ffast-math: every operation rounds as IEEE single
 * precision says, in the order written. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LANES 16
#define ILP 4    /* torch's row_sum: interleaved accumulators */
#define LEVELS 4 /* torch's multi_row_sum: cascade levels */
/* Steps of at least this many elements run on the caller's threads: at a decode step's 64
 * rows (SmolLM2: 36,864 elements a norm) two threads take a norm from 21 to 16 us. */
#define PARALLEL_ELEMENTS 8192

typedef uint16_t bf16;

/* The pool rows a step writes are cold (30 layers' pools and weights pass through the caches
 * between two steps), and each write of a slot's row waited for its lines: in a job the
 * rotary pass took 45-75 us at a decode step's 64 rows against 14.5 us with the pool cached.
 * Asking for the rows of the token WRITE_AHEAD further on, for writing, took it to 55-60 us
 * (alternating jobs, docs/performance.md; 16 was no better, 32 worse). An asm volatile, as
 * in invariant_cpu.c: GCC may delete a __builtin_prefetch whose address nothing else uses. */
#define WRITE_AHEAD 8
#if defined(__x86_64__) || defined(__i386__)
#define PREFETCH_W(p) __asm__ volatile("prefetchw %0" : : "m"(*(const char *)(p)))
#else
#define PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#endif

static inline float widen(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16 narrow(float f) { /* round to nearest even, as torch converts */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (bf16)(f != f ? 0x7fc0u : rounded); /* a select, so loops vectorize */
}

static int64_t ceil_log2(int64_t x) { /* torch's utils::CeilLog2 */
    if (x <= 2)
        return 1;
    int64_t bits = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1)
        bits++;
    return bits;
}

/* acc[lane] += vector `index` of `data` (lanes wide) */
static inline void add_vector(float *acc, const float *data, int64_t index, int lanes) {
    const float *v = data + index * lanes;
    for (int l = 0; l < lanes; l++)
        acc[l] += v[l];
}

/* The sum of `width` floats in the order of torch's vectorized_inner_sum -> row_sum ->
 * multi_row_sum (ATen/native/cpu/SumKernel.cpp) for vectors of `lanes` floats. */
static inline __attribute__((always_inline)) float torch_row_sum(const float *data,
                                                                 int64_t width, int lanes) {
    const int64_t vectors = width / lanes;
    const int64_t groups = vectors / ILP; /* rows of the (-1, ILP) view */
    int64_t power = ceil_log2(groups) / LEVELS;
    if (power < 4)
        power = 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS][ILP][MAX_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < ILP; k++)
                add_vector(acc[0][k], data, i * ILP + k, lanes);
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < groups; i++)
        for (int k = 0; k < ILP; k++)
            add_vector(acc[0][k], data, i * ILP + k, lanes);
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += acc[j][k][l];
    for (int64_t v = groups * ILP; v < vectors; v++)
        add_vector(acc[0][0], data, v, lanes);
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < lanes; l++)
            acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t e = vectors * lanes; e < width; e++)
        total += data[e];
    for (int l = 0; l < lanes; l++)
        total += acc[0][0][l];
    return total;
}

/* The float32 mean of the squares of s[0, width), as transformers' RMSNorm takes it (sq: the
 * squares' scratch) */
static float mean_of_squares(const float *restrict s, float *restrict sq, int64_t width,
                             int lanes) {
    for (int64_t e = 0; e < width; e++)
        sq[e] = s[e] * s[e];
    float sum;
    /* rows narrower than a vector: torch's scalar_inner_sum, the same row_sum on scalars */
    const int vector_lanes = width < lanes ? 1 : lanes;
    switch (vector_lanes) { /* constant lanes: the compiler unrolls the lane loops */
    case 16: sum = torch_row_sum(sq, width, 16); break;
    case 8: sum = torch_row_sum(sq, width, 8); break;
    default: sum = torch_row_sum(sq, width, vector_lanes); break;
    }
    return sum / (float)width;
}

/* s and sq: scratch of `width` floats each (the caller's, one per thread) */
static void norm_row(const bf16 *restrict x, const bf16 *restrict add, bf16 *restrict sum_out,
                     const bf16 *restrict weight, bf16 *restrict out, int64_t width, float eps,
                     int lanes, float *restrict s, float *restrict sq) {
    if (add) {
        for (int64_t e = 0; e < width; e++) {
            bf16 h = narrow(widen(x[e]) + widen(add[e]));
            sum_out[e] = h;
            s[e] = widen(h);
        }
    } else {
        for (int64_t e = 0; e < width; e++)
            s[e] = widen(x[e]);
    }
    const float scale = 1.0f / sqrtf(mean_of_squares(s, sq, width, lanes) + eps);
    for (int64_t e = 0; e < width; e++)
        out[e] = narrow(widen(weight[e]) * widen(narrow(s[e] * scale)));
}

/* Each row's `mean_of_squares`: what the loader's check compares bit for bit (a bfloat16
 * output hides most of a mean's last bits). Returns -1 for unknown lanes, -2 without memory. */
int mean_squares_bf16(const bf16 *x, int64_t x_row, float *out, int64_t rows, int64_t width,
                      int lanes) {
    if (lanes < 1 || lanes > MAX_LANES)
        return -1;
    float *s = (float *)malloc(sizeof(float) * 2 * (size_t)width);
    if (!s)
        return -2;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t e = 0; e < width; e++)
            s[e] = widen(x[r * x_row + e]);
        out[r] = mean_of_squares(s, s + width, width, lanes);
    }
    free(s);
    return 0;
}

/* out[r] = norm(x[r] (+ add[r])), the sum written to sum_out[r] where `add` is given.
 * Returns -1 for unknown lanes, -2 without memory. */
int rms_norm_bf16(const bf16 *x, int64_t x_row, const bf16 *add, int64_t add_row,
                  bf16 *sum_out, int64_t sum_row, const bf16 *weight, bf16 *out,
                  int64_t out_row, int64_t rows, int64_t width, float eps, int lanes,
                  int threads) {
    if (lanes < 1 || lanes > MAX_LANES)
        return -1;
    const int parallel = threads > 1 && rows * width >= PARALLEL_ELEMENTS;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) if (parallel) reduction(| : failed)
    {
        float *scratch = (float *)malloc(sizeof(float) * 2 * (size_t)width);
        if (!scratch)
            failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            if (scratch)
                norm_row(x + r * x_row, add ? add + r * add_row : NULL,
                         add ? sum_out + r * sum_row : NULL, weight, out + r * out_row, width, eps,
                         lanes, scratch, scratch + width);
        free(scratch);
    }
    return failed ? -2 : 0;
}

/* One head's rotation: dst = src * cos + rotate_half(src) * sin, rounded per torch operator */
static inline void rotate(const bf16 *restrict src, bf16 *restrict dst,
                          const bf16 *restrict cos, const bf16 *restrict sin, int64_t half) {
    for (int64_t j = 0; j < half; j++) {
        const float a = widen(src[j]), b = widen(src[j + half]);
        const float lo = widen(narrow(a * widen(cos[j]))) + widen(narrow(-b * widen(sin[j])));
        const float hi = widen(narrow(b * widen(cos[j + half]))) +
                         widen(narrow(a * widen(sin[j + half])));
        dst[j] = narrow(lo);
        dst[j + half] = narrow(hi);
    }
}

/* Where a step's rotated keys and its values go in the attention kernel's pools: token t's
 * row to slot slots[t] of each (a slot: one contiguous row of a token's heads). */
typedef struct {
    bf16 *k_pool, *v_pool;
    int64_t k_slot, v_slot, pool_slots; /* slot strides (elements), slots in both pools */
    const bf16 *v;                     /* the step's values, a token's heads side by side */
    int64_t v_row, v_width;            /* its row stride and a token's elements */
    const int64_t *slots;              /* [T] */
} PoolWrite;

/* q_out [T, q_heads, dim] and k_out [T, k_heads, dim] (contiguous) from rows of q and k
 * (heads side by side in a row) and cos/sin rows [T, dim]; where `pools` is given, each
 * token's rotated keys and its values are also copied into their pool slots (what
 * index_copy_ into the pools would do, in the same pass over the tokens). Returns -1 for an
 * odd head size, -3 for a slot outside the pools (nothing written then). */
int rotary_bf16(const bf16 *q, int64_t q_row, bf16 *q_out, const bf16 *k, int64_t k_row,
                bf16 *k_out, const bf16 *cos, const bf16 *sin, int64_t cs_row, int64_t tokens,
                int64_t q_heads, int64_t k_heads, int64_t dim, const PoolWrite *pools,
                int threads) {
    if (dim % 2)
        return -1;
    if (pools)
        for (int64_t t = 0; t < tokens; t++)
            if (pools->slots[t] < 0 || pools->slots[t] >= pools->pool_slots)
                return -3;
    const int64_t heads = q_heads + k_heads, half = dim / 2;
    const int parallel = threads > 1 && tokens * heads * dim >= PARALLEL_ELEMENTS;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (parallel) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const bf16 *c = cos + t * cs_row, *s = sin + t * cs_row;
        for (int64_t h = 0; h < q_heads; h++)
            rotate(q + t * q_row + h * dim, q_out + (t * q_heads + h) * dim, c, s, half);
        for (int64_t h = 0; h < k_heads; h++)
            rotate(k + t * k_row + h * dim, k_out + (t * k_heads + h) * dim, c, s, half);
        if (pools) {
            if (t + WRITE_AHEAD < tokens) { /* a later token's slot rows, fetched for writing */
                const int64_t ahead = pools->slots[t + WRITE_AHEAD];
                const char *pk = (const char *)(pools->k_pool + ahead * pools->k_slot);
                const char *pv = (const char *)(pools->v_pool + ahead * pools->v_slot);
                for (int64_t b = 0; b < k_heads * dim * 2; b += 64) PREFETCH_W(pk + b);
                for (int64_t b = 0; b < pools->v_width * 2; b += 64) PREFETCH_W(pv + b);
            }
            const int64_t slot = pools->slots[t];
            memcpy(pools->k_pool + slot * pools->k_slot, k_out + t * k_heads * dim,
                   sizeof(bf16) * (size_t)(k_heads * dim));
            memcpy(pools->v_pool + slot * pools->v_slot, pools->v + t * pools->v_row,
                   sizeof(bf16) * (size_t)pools->v_width);
        }
    }
    return 0;
}

/* out = table[gate] * up, rounded to bfloat16: the MLP's `act_fn(gate_proj(x)) * up_proj(x)`
 * with the activation of every bfloat16 value looked up. */
int act_mul_bf16(const bf16 *gate, int64_t g_row, const bf16 *up, int64_t u_row,
                 const float *restrict table, bf16 *out, int64_t rows, int64_t width,
                 int threads) {
    const int parallel = threads > 1 && rows * width >= PARALLEL_ELEMENTS;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) if (parallel) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *restrict g = gate + r * g_row, *restrict u = up + r * u_row;
        bf16 *restrict o = out + r * width;
        for (int64_t e = 0; e < width; e++)
            o[e] = narrow(table[g[e]] * widen(u[e])); /* float table: one 32-bit gather */
    }
    return 0;
}

int pool_write_size(void) { return (int)sizeof(PoolWrite); }
