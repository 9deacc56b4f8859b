/* Batch-invariant paged attention for the CPU, bfloat16: one query token (or up to TILE of a
 * prefill chunk's, each on its own arithmetic) x one KV head at a
 * time (its query heads of the group side by side), keys and values read from the paged
 * pool in place. Why the arithmetic is what it is: invariant_cpu.py.
 *
 * Built with -ffp-contract=off and without -ffast-math: every operation below rounds as IEEE
 * single precision says, in the order written, whatever vector width the compiler picks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SPLIT 512 /* keys per block of the walk: torch's CPU flash kernel's split */
#define LANES 16  /* partial sums per reduction, folded in a fixed tree */
#define MAX_DIM 256 /* head sizes, padded to whole lanes */
#define MAX_GROUP 64 /* query heads per KV head */

typedef struct {
    const uint16_t *q;
    int64_t q_token, q_head;
    const uint16_t *k;
    int64_t k_slot, k_head;
    const uint16_t *v;
    int64_t v_slot, v_head;
    uint16_t *out;
    int64_t o_token, o_head;
    const int32_t *tables;
    int64_t table_stride, table_rows, table_width; /* [rows, width] page ids */
    int64_t slots;                                  /* the pool's slots (pages x page size) */
    const int32_t *token_table; /* [T] the row of `tables` */
    const int32_t *token_keys;  /* [T] position + 1 */
    const int32_t *key_ends;    /* [T] keys seen (an image's end), or NULL: token_keys */
    const float *sinks;         /* [Hq] or NULL */
    int64_t tokens, kv_heads, group, head_dim, value_dim, page_size, window;
    float scale;
} Job;

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even, as torch's conversion does (finite inputs only) */
static inline float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline uint16_t float_to_bf16(float x) {
    x = round_bf16(x);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}

/* exp(x) for x <= 0 (a score minus its running maximum); 0 below -87 and for -inf. Range
 * reduction by ln 2 in two parts, a degree-6 polynomial (relative error ~1e-7), the power of
 * two from the exponent bits; plain multiplies and adds, so it vectorizes and every lane
 * rounds the same. */
static inline float exp_nonpositive(float x) {
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float clamped = x < -87.0f ? -87.0f : x;
    float t = clamped * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = clamped - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x < -87.0f ? 0.0f : y;
}

typedef struct {
    float *q, *scores, *probs, *acc; /* [G, padded D], [G, SPLIT] twice, [G, padded Dv] */
} Scratch;

#define TILE 4 /* a prefill chunk's consecutive tokens computed together (their keys read once) */

/* A split's query rows: row r sees the split's keys [lo[r], lo[r] + n[r]) (n <= 0: none). */
typedef struct {
    int64_t count, lo[TILE * MAX_GROUP], n[TILE * MAX_GROUP];
} Rows;

/* The pool slots of keys [lo, lo + n): one division, then a page's run at a time (a division
 * per key cost more than the key's arithmetic; a branch per key ~4% of a decode call). */
static inline void slots_of(const Job *j, const int32_t *table, int64_t lo, int64_t n,
                            int64_t *slots) {
    int64_t page = lo / j->page_size, offset = lo % j->page_size;
    for (int64_t i = 0; i < n; page++, offset = 0) {
        const int64_t base = (int64_t)table[page] * j->page_size + offset;
        const int64_t run = j->page_size - offset < n - i ? j->page_size - offset : n - i;
        for (int64_t o = 0; o < run; o++) slots[i + o] = base + o;
        i += run;
    }
}

static inline int64_t padded(int64_t n) { return (n + LANES - 1) / LANES * LANES; }

/* Prefetches as volatile asm: GCC (12.2, -O2 and -O3) takes __builtin_prefetch for an
 * operation without effects, finds a function of nothing but prefetches const and deletes its
 * calls, and with them the loops that compute their addresses; objdump found 2 of this file's
 * prefetches left, the split's (below) among the deleted ones. An asm volatile stays. */
#if defined(__x86_64__) || defined(__i386__)
#define PREFETCH_L1(p) __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)(p)))
#define PREFETCH_L2(p) __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)(p)))
#else
#define PREFETCH_L1(p) __builtin_prefetch((p), 0, 3)
#define PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#endif
/* how many keys ahead the walk asks for rows (the pages scatter them past the hardware
 * prefetchers): at ~30 cycles of a decode item's arithmetic a key, 32 keys cover a DRAM miss
 * (16 and 64 were slower in the engine) */
#define AHEAD 32

#ifdef __AVX512F__
#include <immintrin.h>

/* The portable code's arithmetic (below), 16 lanes to a register: lane l of a dot product
 * sums elements l, l + 16, ... in order, and the lanes fold in the same tree
 * (_mm512_reduce_add_ps: halves, then quarters, ...). Multiply-adds are fused only where the
 * product is exact (bfloat16 x bfloat16 fits float32), so they round as a multiply and an
 * add do. */
static inline __m512 load_bf16(const uint16_t *p, int64_t n) {
    const __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* sixteen elements, no mask: the load folds into the widening (one instruction fewer) */
static inline __m512 load_bf16_whole(const uint16_t *p) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

static inline __m512 exp_vec(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    const __m512 floor_ = _mm512_set1_ps(-87.0f);
    __m512 clamped = _mm512_max_ps(x, floor_);
    __m512 t = _mm512_add_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)), shifter);
    __m512 n = _mm512_sub_ps(t, shifter);
    __m512 r = _mm512_sub_ps(clamped, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.3981999507e-3f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
    __mmask16 under = _mm512_cmp_ps_mask(x, floor_, _CMP_LT_OQ);
    return _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
}

static inline __m512 round_bf16_vec(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

#define CHUNKS (MAX_DIM / LANES)

/* Scores of the split's keys [0, n) (slots given) for `rows` query rows, row r only over its
 * own keys [lo[r], lo[r] + count[r]); each key converted once for every row that sees it. */
static void scores_any(const Job *j, const int64_t *slots, int64_t h, const float *qf, int64_t n,
                      const Rows *rows, float *scores) {
    const int64_t D = j->head_dim, C = padded(D) / LANES;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *k = j->k + slots[i] * j->k_slot + h * j->k_head;
        __m512 kv[CHUNKS];
        for (int64_t c = 0; c < C; c++) kv[c] = load_bf16(k + LANES * c, D - LANES * c);
        for (int64_t r = 0; r < rows->count; r++) {
            if (i < rows->lo[r] || i >= rows->lo[r] + rows->n[r]) continue;
            const float *q = qf + r * C * LANES;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), kv[0]);
            for (int64_t c = 1; c < C; c++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + LANES * c), kv[c], acc);
            scores[r * SPLIT + i] = _mm512_reduce_add_ps(acc) * j->scale;
        }
    }
}

/* The largest of top and sc[0, n): sixteen running maxima, then their largest (a maximum is
 * exact, so any order gives the portable loop's value). */
static float split_max(const float *sc, int64_t n, float top) {
    __m512 m = _mm512_set1_ps(top);
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) m = _mm512_max_ps(_mm512_loadu_ps(sc + i), m);
    top = _mm512_reduce_max_ps(m);
    for (; i < n; i++) top = sc[i] > top ? sc[i] : top;
    return top;
}

/* p = exp(score - top) into probs, rounded to bfloat16; returns the unrounded sum. */
static float exponentials(const float *sc, int64_t n, float top, float *pr) {
    const __m512 t = _mm512_set1_ps(top);
    __m512 lanes = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += LANES) {
        const int64_t left = n - i;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 e = exp_vec(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + i), t));
        e = _mm512_maskz_mov_ps(m, e);
        lanes = _mm512_add_ps(lanes, e);
        _mm512_mask_storeu_ps(pr + i, m, round_bf16_vec(e));
    }
    return _mm512_reduce_add_ps(lanes);
}

/* The key ranges [lo[r], hi[r]) of rows r0 .. r0 + R - 1 and the keys any of them sees,
 * [*from, *to) (empty where none sees any). */
static inline void block_ranges(const Rows *rows, int64_t r0, int64_t R, int64_t *lo,
                                int64_t *hi, int64_t *from, int64_t *to) {
    *from = INT64_MAX;
    *to = 0;
    for (int64_t r = 0; r < R; r++) {
        lo[r] = rows->lo[r0 + r];
        hi[r] = rows->lo[r0 + r] + rows->n[r0 + r];
        if (hi[r] <= lo[r]) continue;
        *from = lo[r] < *from ? lo[r] : *from;
        *to = hi[r] > *to ? hi[r] : *to;
    }
}

/* acc[r] += p[r, i] x value i over each row's own keys, in key order; four rows' outputs in
 * registers at a time, each value converted once for them. */
static void values_any(const Job *j, const int64_t *slots, int64_t h, const float *probs,
                       const Rows *rows, float *accs) {
    const int64_t Dv = j->value_dim, C = padded(Dv) / LANES;
    for (int64_t r0 = 0; r0 < rows->count; r0 += 4) {
        const int64_t m = rows->count - r0 < 4 ? rows->count - r0 : 4;
        int64_t lo[4], hi[4], from, to;
        block_ranges(rows, r0, m, lo, hi, &from, &to);
        __m512 acc[4][CHUNKS];
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < C; c++)
                acc[r][c] = _mm512_loadu_ps(accs + (r0 + r) * C * LANES + LANES * c);
        for (int64_t i = from; i < to; i++) {
            const uint16_t *v = j->v + slots[i] * j->v_slot + h * j->v_head;
            __m512 vv[CHUNKS];
            for (int64_t c = 0; c < C; c++) vv[c] = load_bf16(v + LANES * c, Dv - LANES * c);
            for (int64_t r = 0; r < m; r++) {
                if (i < lo[r] || i >= hi[r]) continue;
                const __m512 p = _mm512_set1_ps(probs[(r0 + r) * SPLIT + i]);
                for (int64_t c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
            }
        }
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < C; c++)
                _mm512_storeu_ps(accs + (r0 + r) * C * LANES + LANES * c, acc[r][c]);
    }
}

/* The reduction tree of _mm512_reduce_add_ps (halves, quarters, pairs, then the last two
 * lanes) run for sixteen keys at once: each step adds lane l to lane l + w of every key, as
 * _mm512_reduce_add_ps does for one, with the keys side by side in the registers. Every score
 * keeps the bits of its own reduction; a key costs about 3 shuffles and adds instead of 7
 * dependent ones (the scores were 57% of a decode call, perf). */
static inline __m512 fold_halves(__m512 a, __m512 b) { /* [a(l) + a(l+8) | b(l) + b(l+8)] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
}
static inline __m512 fold_quarters(__m512 a, __m512 b) { /* four keys' four lanes */
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
}
static inline __m512 fold_pairs(__m512 a, __m512 b) { /* lanes 0 + 2, 1 + 3 of each quarter */
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline __m512 fold_last(__m512 a, __m512 b) { /* lane 4i + j: key 4j + i */
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __attribute__((always_inline)) __m512 dot_lanes(const __m512 *q, const __m512 *k,
                                                              const int C) {
    __m512 acc = _mm512_mul_ps(q[0], k[0]);
#pragma GCC unroll 8
    for (int c = 1; c < C; c++) acc = _mm512_fmadd_ps(q[c], k[c], acc);
    return acc;
}

static inline __attribute__((always_inline)) void load_key(const Job *j, const int64_t *slots,
                                                           int64_t h, int64_t i, int64_t to,
                                                           __m512 *kv, const int C) {
    const int64_t D = j->head_dim;
    const uint16_t *k = j->k + slots[i] * j->k_slot + h * j->k_head;
    if (i + AHEAD < to) { /* key i + AHEAD's row into L1, its value row into L2 */
        const char *pk = (const char *)(j->k + slots[i + AHEAD] * j->k_slot + h * j->k_head);
        const char *pv = (const char *)(j->v + slots[i + AHEAD] * j->v_slot + h * j->v_head);
        for (int64_t b = 0; b < D * 2; b += 64) PREFETCH_L1(pk + b);
        for (int64_t b = 0; b < j->value_dim * 2; b += 64) PREFETCH_L2(pv + b);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        kv[c] = D == LANES * C ? load_bf16_whole(k + LANES * c) : load_bf16(k + LANES * c, D - LANES * c);
}

/* The same arithmetic with C chunks of 16 and R rows as compile-time constants (the common
 * head sizes 64 and 128, a decode token's group): queries and partial outputs stay in
 * registers across the keys instead of a load and a store per key; keys every row sees go
 * sixteen at a time through the folded tree above. */
static inline __attribute__((always_inline)) void scores_fixed(
    const Job *j, const int64_t *slots, int64_t h, const float *qf, const Rows *rows,
    float *scores, int64_t r0, const int R, const int C) {
    __m512 q[4][8];
    int64_t lo[4], hi[4], from, to, common_lo = 0, common_hi = INT64_MAX;
    block_ranges(rows, r0, R, lo, hi, &from, &to);
    for (int r = 0; r < R; r++) {
        common_lo = lo[r] > common_lo ? lo[r] : common_lo;
        common_hi = hi[r] < common_hi ? hi[r] : common_hi;
        for (int c = 0; c < C; c++) q[r][c] = _mm512_loadu_ps(qf + (r0 + r) * C * LANES + LANES * c);
    }
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512 scale = _mm512_set1_ps(j->scale);
    for (int64_t i = from; i < to;) {
        if (i >= common_lo && i + LANES <= common_hi) {
            __m512 half[4][2];
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                __m512 quarter[4][2];
#pragma GCC unroll 2
                for (int f = 0; f < 2; f++) {
                    __m512 pair[4][2];
#pragma GCC unroll 2
                    for (int g = 0; g < 2; g++) {
                        const int64_t at = i + 8 * e + 4 * f + 2 * g;
                        __m512 ka[8], kb[8];
                        load_key(j, slots, h, at, to, ka, C);
                        load_key(j, slots, h, at + 1, to, kb, C);
#pragma GCC unroll 4
                        for (int r = 0; r < R; r++)
                            pair[r][g] = fold_halves(dot_lanes(q[r], ka, C), dot_lanes(q[r], kb, C));
                    }
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) quarter[r][f] = fold_quarters(pair[r][0], pair[r][1]);
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) half[r][e] = fold_pairs(quarter[r][0], quarter[r][1]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512 sums = _mm512_permutexvar_ps(order, fold_last(half[r][0], half[r][1]));
                _mm512_storeu_ps(scores + (r0 + r) * SPLIT + i, _mm512_mul_ps(sums, scale));
            }
            i += LANES;
            continue;
        }
        __m512 kv[8];
        load_key(j, slots, h, i, to, kv, C);
        for (int r = 0; r < R; r++) {
            if (i < lo[r] || i >= hi[r]) continue;
            scores[(r0 + r) * SPLIT + i] = _mm512_reduce_add_ps(dot_lanes(q[r], kv, C)) * j->scale;
        }
        i++;
    }
}

/* Values 32 at a time: one load, then the even elements (shifted up) and the odd ones (masked)
 * as two registers of floats. Each output element still sums p x value over the keys in key
 * order, the same bits; only the registers hold the elements interleaved, so the partial
 * outputs are reordered on the way in and out. */
static inline __attribute__((always_inline)) void values_fixed(
    const Job *j, const int64_t *slots, int64_t h, const float *probs, const Rows *rows,
    float *accs, int64_t r0, const int R, const int C) {
    const int64_t Dv = j->value_dim;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i high = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512i upper = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[4][8];
    int64_t lo[4], hi[4], from, to;
    block_ranges(rows, r0, R, lo, hi, &from, &to);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c += 2) {
            const float *a = accs + (r0 + r) * C * LANES + LANES * c;
            const __m512 first = _mm512_loadu_ps(a), second = _mm512_loadu_ps(a + LANES);
            acc[r][c] = _mm512_permutex2var_ps(first, even, second);
            acc[r][c + 1] = _mm512_permutex2var_ps(first, odd, second);
        }
    for (int64_t i = from; i < to; i++) {
        const uint16_t *v = j->v + slots[i] * j->v_slot + h * j->v_head;
        __m512 vv[8];
#pragma GCC unroll 4
        for (int c = 0; c < C; c += 2) {
            const int64_t left = Dv - LANES * c;
            const __mmask32 m = left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
            const __m512i x = left >= 32 ? _mm512_loadu_si512(v + LANES * c) : _mm512_maskz_loadu_epi16(m, v + LANES * c);
            vv[c] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            vv[c + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, upper));
        }
        for (int r = 0; r < R; r++) {
            if (i < lo[r] || i >= hi[r]) continue;
            const __m512 p = _mm512_set1_ps(probs[(r0 + r) * SPLIT + i]);
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c += 2) {
            float *a = accs + (r0 + r) * C * LANES + LANES * c;
            _mm512_storeu_ps(a, _mm512_permutex2var_ps(acc[r][c], low, acc[r][c + 1]));
            _mm512_storeu_ps(a + LANES, _mm512_permutex2var_ps(acc[r][c], high, acc[r][c + 1]));
        }
}

/* CALL(R, C) over `count` rows in register blocks: 4 rows of 4 chunks (head size 64), 2 of 8
 * (128); r0 the block's first row. */
#define OVER_BLOCKS(C, count, CALL)                                                            \
    for (int64_t r0 = 0; r0 < (count); r0 += (C) == 4 ? 4 : 2) {                              \
        const int64_t R = (count) - r0;                                                        \
        if ((C) == 4) {                                                                        \
            if (R >= 4) CALL(4, 4);                                                            \
            else if (R == 3) CALL(3, 4);                                                       \
            else if (R == 2) CALL(2, 4);                                                       \
            else CALL(1, 4);                                                                   \
        } else {                                                                               \
            if (R >= 2) CALL(2, 8);                                                            \
            else CALL(1, 8);                                                                   \
        }                                                                                      \
    }

static void scores_of(const Job *j, const int64_t *slots, int64_t h, const float *qf, int64_t n,
                      const Rows *rows, float *scores) {
    const int64_t C = padded(j->head_dim) / LANES;
#define SCORES(RR, CC) scores_fixed(j, slots, h, qf, rows, scores, r0, RR, CC)
    if (C == 4 || C == 8)
        OVER_BLOCKS(C, rows->count, SCORES)
    else
        scores_any(j, slots, h, qf, n, rows, scores);
#undef SCORES
}

static void add_values(const Job *j, const int64_t *slots, int64_t h, const float *probs,
                       int64_t n, const Rows *rows, float *accs) {
    (void)n; /* the portable code's bound; here each row's own range bounds the keys */
    const int64_t C = padded(j->value_dim) / LANES;
#define VALUES(RR, CC) values_fixed(j, slots, h, probs, rows, accs, r0, RR, CC)
    if (C == 4 || C == 8)
        OVER_BLOCKS(C, rows->count, VALUES)
    else
        values_any(j, slots, h, probs, rows, accs);
#undef VALUES
}
#else
static inline float fold_lanes(float *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

static void scores_of(const Job *j, const int64_t *slots, int64_t h, const float *qf, int64_t n,
                      const Rows *rows, float *scores) {
    const int64_t D = j->head_dim, P = padded(D);
    float key[MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *k = j->k + slots[i] * j->k_slot + h * j->k_head;
        for (int64_t d = 0; d < P; d++) key[d] = d < D ? bf16_to_float(k[d]) : 0.0f;
        for (int64_t r = 0; r < rows->count; r++) {
            if (i < rows->lo[r] || i >= rows->lo[r] + rows->n[r]) continue;
            const float *q = qf + r * P;
            float acc[LANES];
            for (int l = 0; l < LANES; l++) acc[l] = q[l] * key[l];
            for (int64_t c = LANES; c < P; c += LANES)
                for (int l = 0; l < LANES; l++) acc[l] = acc[l] + q[c + l] * key[c + l];
            scores[r * SPLIT + i] = fold_lanes(acc) * j->scale;
        }
    }
}

static float split_max(const float *sc, int64_t n, float top) {
    for (int64_t i = 0; i < n; i++) top = sc[i] > top ? sc[i] : top;
    return top;
}

static float exponentials(const float *sc, int64_t n, float top, float *pr) {
    float lanes[LANES] = {0};
    for (int64_t i = 0; i < n; i += LANES)
        for (int l = 0; l < LANES && i + l < n; l++) {
            const float e = exp_nonpositive(sc[i + l] - top);
            lanes[l] = lanes[l] + e;
            pr[i + l] = round_bf16(e);
        }
    return fold_lanes(lanes);
}

static void add_values(const Job *j, const int64_t *slots, int64_t h, const float *probs,
                       int64_t n, const Rows *rows, float *accs) {
    const int64_t Dv = j->value_dim, P = padded(Dv);
    float value[MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *v = j->v + slots[i] * j->v_slot + h * j->v_head;
        for (int64_t d = 0; d < P; d++) value[d] = d < Dv ? bf16_to_float(v[d]) : 0.0f;
        for (int64_t r = 0; r < rows->count; r++) {
            if (i < rows->lo[r] || i >= rows->lo[r] + rows->n[r]) continue;
            const float p = probs[r * SPLIT + i];
            float *acc = accs + r * P;
            for (int64_t d = 0; d < P; d++) acc[d] = acc[d] + p * value[d];
        }
    }
}
#endif

/* Asks for the split's first key and value rows of head h (into L2) before the walk reads
 * them. The AVX-512 walk of head sizes 64 and 128 (`load_key`) asks for the rest AHEAD keys
 * ahead as it goes (a burst for the whole split waited on memory before any arithmetic:
 * kernel 0.92x against none, 0.84-0.87x for the walk's); the other walks do not, so they get
 * the whole split here. No arithmetic. */
static void prefetch_split(const Job *j, const int64_t *slots, int64_t n, int64_t h) {
    const int64_t key_bytes = j->head_dim * 2, value_bytes = j->value_dim * 2;
#ifdef __AVX512F__
    const int64_t C = padded(j->head_dim) / LANES;
    if (C == 4 || C == 8) n = n < AHEAD ? n : AHEAD;
#endif
    for (int64_t i = 0; i < n; i++) {
        const char *k = (const char *)(j->k + slots[i] * j->k_slot + h * j->k_head);
        const char *v = (const char *)(j->v + slots[i] * j->v_slot + h * j->v_head);
        for (int64_t b = 0; b < key_bytes; b += 64) PREFETCH_L2(k + b);
        for (int64_t b = 0; b < value_bytes; b += 64) PREFETCH_L2(v + b);
    }
}

/* Whether token t's table row, its pages and their slots lie inside the arrays given. */
static int in_range(const Job *j, int64_t t) {
    const int64_t row = j->token_table[t];
    const int64_t keys = j->key_ends ? j->key_ends[t] : j->token_keys[t];
    if (row < 0 || row >= j->table_rows || keys < 1 || j->token_keys[t] < 1) return 0;
    if ((keys - 1) / j->page_size >= j->table_width) return 0;
    const int32_t *table = j->tables + row * j->table_stride;
    for (int64_t p = 0; p <= (keys - 1) / j->page_size; p++)
        if (table[p] < 0 || ((int64_t)table[p] + 1) * j->page_size > j->slots) return 0;
    return 1;
}

/* Tokens [t, t + count) of one sequence (one table row), one KV head: each token's `group`
 * query heads are rows of their own, each walking its own keys from position 0 in splits of
 * SPLIT; rows only share the loading of the keys and values they both see, so a row's bits
 * are what it gets alone. */
static void attend(const Job *j, Scratch *s, int64_t t, int64_t count, int64_t h) {
    const int64_t G = j->group, D = j->head_dim, Dv = j->value_dim;
    const int64_t P = padded(D), Pv = padded(Dv), R = count * G;
    const int32_t *table = j->tables + (int64_t)j->token_table[t] * j->table_stride;
    float max[TILE * MAX_GROUP], sum[TILE * MAX_GROUP];
    int64_t first[TILE], keys[TILE], started[TILE * MAX_GROUP], slots[SPLIT];
    int64_t lowest = INT64_MAX, highest = 0;
    for (int64_t u = 0; u < count; u++) {
        keys[u] = j->key_ends ? j->key_ends[t + u] : j->token_keys[t + u];
        first[u] = 0; /* keys at positions <= p - window are outside the window */
        if (j->window > 0 && j->token_keys[t + u] > j->window)
            first[u] = j->token_keys[t + u] - j->window;
        lowest = first[u] < lowest ? first[u] : lowest;
        highest = keys[u] > highest ? keys[u] : highest;
    }
    for (int64_t r = 0; r < R; r++) {
        const int64_t u = r / G, g = r % G;
        const uint16_t *q = j->q + (t + u) * j->q_token + (h * G + g) * j->q_head;
        for (int64_t d = 0; d < P; d++) s->q[r * P + d] = d < D ? bf16_to_float(q[d]) : 0.0f;
        max[r] = j->sinks ? j->sinks[h * G + g] : -__builtin_inff();
        sum[r] = 0.0f;
        started[r] = 0;
        memset(s->acc + r * Pv, 0, sizeof(float) * Pv);
    }
    Rows rows;
    rows.count = R;
    for (int64_t start = lowest / SPLIT * SPLIT; start < highest; start += SPLIT) {
        /* the split's keys any row sees: [base, base + n) */
        int64_t base = INT64_MAX, end = 0;
        for (int64_t u = 0; u < count; u++) {
            const int64_t lo = start > first[u] ? start : first[u];
            const int64_t hi = start + SPLIT < keys[u] ? start + SPLIT : keys[u];
            if (hi <= lo) continue;
            base = lo < base ? lo : base;
            end = hi > end ? hi : end;
        }
        if (end == 0) continue;
        for (int64_t r = 0; r < R; r++) {
            const int64_t u = r / G;
            const int64_t lo = start > first[u] ? start : first[u];
            const int64_t hi = start + SPLIT < keys[u] ? start + SPLIT : keys[u];
            rows.lo[r] = lo - base;
            rows.n[r] = hi - lo;
        }
        const int64_t n = end - base;
        slots_of(j, table, base, n, slots);
        prefetch_split(j, slots, n, h);
        scores_of(j, slots, h, s->q, n, &rows, s->scores);
        for (int64_t r = 0; r < R; r++) {
            if (rows.n[r] <= 0) continue;
            const float *sc = s->scores + r * SPLIT + rows.lo[r];
            const float top = split_max(sc, rows.n[r], max[r]);
            const float block_sum =
                exponentials(sc, rows.n[r], top, s->probs + r * SPLIT + rows.lo[r]);
            const float rescale = exp_nonpositive(max[r] - top);
            sum[r] = block_sum + rescale * sum[r];
            max[r] = top;
            if (started[r]) {
                float *acc = s->acc + r * Pv;
                for (int64_t d = 0; d < Pv; d++) acc[d] = acc[d] * rescale;
            }
            started[r] = 1;
        }
        add_values(j, slots, h, s->probs, n, &rows, s->acc);
    }
    for (int64_t r = 0; r < R; r++) {
        const int64_t u = r / G, g = r % G;
        float total = sum[r];
        if (j->sinks) total = total + exp_nonpositive(j->sinks[h * G + g] - max[r]);
        const float inverse = 1.0f / total;
        uint16_t *o = j->out + (t + u) * j->o_token + (h * G + g) * j->o_head;
        const float *acc = s->acc + r * Pv;
        for (int64_t d = 0; d < Dv; d++) o[d] = float_to_bf16(acc[d] * inverse);
    }
}

/* Returns 0; -1 for shapes past the limits; -2 without memory; -3 for a token whose table
 * row, pages or slots lie outside the arrays given. Work items (tile of tokens, KV head)
 * are independent, so how they fall to threads changes no bits; the threads are the OpenMP
 * pool torch's own operators use (the same libgomp), so none of them spins beside ours. */
int invariant_attention_bf16(const Job *j, int threads) {
    const int64_t G = j->group, P = padded(j->head_dim), Pv = padded(j->value_dim);
    if (G > MAX_GROUP || P > MAX_DIM || Pv > MAX_DIM) return -1;
    for (int64_t t = 0; t < j->tokens; t++)
        if (!in_range(j, t)) return -3;
    /* tiles: up to TILE consecutive tokens of one table row (a prefill chunk's) */
    int64_t *tiles = (int64_t *)malloc(sizeof(int64_t) * (size_t)(j->tokens + 1));
    if (!tiles) return -2;
    int64_t count = 0;
    for (int64_t t = 0; t < j->tokens; t++)
        if (t == 0 || j->token_table[t] != j->token_table[t - 1] || t - tiles[count - 1] == TILE)
            tiles[count++] = t;
    tiles[count] = j->tokens;
    const int64_t items = count * j->kv_heads, rows = TILE * G;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(| : failed)
    {
        float *buffer = (float *)malloc(sizeof(float) * (size_t)(rows * (P + 2 * SPLIT + Pv)));
        if (!buffer) failed = 1;
        Scratch s = {buffer, buffer + rows * P, buffer + rows * (P + SPLIT),
                     buffer + rows * (P + 2 * SPLIT)};
#pragma omp for schedule(dynamic, 2)
        for (int64_t item = 0; item < items; item++) {
            const int64_t tile = item / j->kv_heads;
            if (buffer)
                attend(j, &s, tiles[tile], tiles[tile + 1] - tiles[tile], item % j->kv_heads);
        }
        free(buffer);
    }
    free(tiles);
    return failed ? -2 : 0;
}

int job_size(void) { return (int)sizeof(Job); }
