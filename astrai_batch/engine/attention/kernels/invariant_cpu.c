/* Batch-invariant paged attention for the CPU, bfloat16: one query token x one KV head at a
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

/* The pool slots of keys [lo, lo + n): one division, then page by page (a division per key
 * cost more than the key's arithmetic). */
static inline void slots_of(const Job *j, const int32_t *table, int64_t lo, int64_t n,
                            int64_t *slots) {
    int64_t page = lo / j->page_size, offset = lo % j->page_size;
    int64_t base = (int64_t)table[page] * j->page_size;
    for (int64_t i = 0; i < n; i++) {
        slots[i] = base + offset;
        if (++offset == j->page_size && i + 1 < n) {
            offset = 0;
            base = (int64_t)table[++page] * j->page_size;
        }
    }
}

static inline int64_t padded(int64_t n) { return (n + LANES - 1) / LANES * LANES; }

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
#define AHEAD 8 /* keys whose rows are fetched ahead of use (pages scatter them) */

static inline void prefetch_row(const uint16_t *p, int64_t n) {
    for (int64_t b = 0; b < n * 2; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

static void scores_of(const Job *j, const int64_t *slots, int64_t h, const float *qf, int64_t n,
                      float *scores) {
    const int64_t G = j->group, D = j->head_dim, C = padded(D) / LANES;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *k = j->k + slots[i] * j->k_slot + h * j->k_head;
        if (i + AHEAD < n) prefetch_row(j->k + slots[i + AHEAD] * j->k_slot + h * j->k_head, D);
        __m512 kv[CHUNKS];
        for (int64_t c = 0; c < C; c++) kv[c] = load_bf16(k + LANES * c, D - LANES * c);
        for (int64_t r = 0; r < G; r++) {
            const float *q = qf + r * C * LANES;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), kv[0]);
            for (int64_t c = 1; c < C; c++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + LANES * c), kv[c], acc);
            scores[r * SPLIT + i] = _mm512_reduce_add_ps(acc) * j->scale;
        }
    }
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

static void add_values(const Job *j, const int64_t *slots, int64_t h, const float *probs,
                       int64_t n, float *accs) {
    const int64_t G = j->group, Dv = j->value_dim, C = padded(Dv) / LANES;
    for (int64_t r0 = 0; r0 < G; r0 += 4) { /* up to 4 rows' outputs held in registers */
        const int64_t rows = G - r0 < 4 ? G - r0 : 4;
        __m512 acc[4][CHUNKS];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < C; c++) acc[r][c] = _mm512_loadu_ps(accs + (r0 + r) * C * LANES + LANES * c);
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *v = j->v + slots[i] * j->v_slot + h * j->v_head;
            if (i + AHEAD < n) prefetch_row(j->v + slots[i + AHEAD] * j->v_slot + h * j->v_head, Dv);
            __m512 vv[CHUNKS];
            for (int64_t c = 0; c < C; c++) vv[c] = load_bf16(v + LANES * c, Dv - LANES * c);
            for (int64_t r = 0; r < rows; r++) {
                const __m512 p = _mm512_set1_ps(probs[(r0 + r) * SPLIT + i]);
                for (int64_t c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < C; c++) _mm512_storeu_ps(accs + (r0 + r) * C * LANES + LANES * c, acc[r][c]);
    }
}
#else
static inline float fold_lanes(float *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

static void scores_of(const Job *j, const int64_t *slots, int64_t h, const float *qf, int64_t n,
                      float *scores) {
    const int64_t G = j->group, D = j->head_dim, P = padded(D);
    float key[MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *k = j->k + slots[i] * j->k_slot + h * j->k_head;
        for (int64_t d = 0; d < P; d++) key[d] = d < D ? bf16_to_float(k[d]) : 0.0f;
        for (int64_t r = 0; r < G; r++) {
            const float *q = qf + r * P;
            float acc[LANES];
            for (int l = 0; l < LANES; l++) acc[l] = q[l] * key[l];
            for (int64_t c = LANES; c < P; c += LANES)
                for (int l = 0; l < LANES; l++) acc[l] = acc[l] + q[c + l] * key[c + l];
            scores[r * SPLIT + i] = fold_lanes(acc) * j->scale;
        }
    }
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
                       int64_t n, float *accs) {
    const int64_t G = j->group, Dv = j->value_dim, P = padded(Dv);
    float value[MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *v = j->v + slots[i] * j->v_slot + h * j->v_head;
        for (int64_t d = 0; d < P; d++) value[d] = d < Dv ? bf16_to_float(v[d]) : 0.0f;
        for (int64_t r = 0; r < G; r++) {
            const float p = probs[r * SPLIT + i];
            float *acc = accs + r * P;
            for (int64_t d = 0; d < P; d++) acc[d] = acc[d] + p * value[d];
        }
    }
}
#endif

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

/* One query token's attention for one KV head: its `group` query heads side by side. */
static void attend(const Job *j, Scratch *s, int64_t t, int64_t h) {
    const int64_t G = j->group, D = j->head_dim, Dv = j->value_dim;
    const int64_t P = padded(D), Pv = padded(Dv);
    const int64_t keys = j->key_ends ? j->key_ends[t] : j->token_keys[t];
    int64_t first = 0; /* keys at positions <= p - window are outside the window */
    if (j->window > 0 && j->token_keys[t] > j->window) first = j->token_keys[t] - j->window;
    const int32_t *table = j->tables + (int64_t)j->token_table[t] * j->table_stride;
    float max[MAX_GROUP], sum[MAX_GROUP];
    int64_t slots[SPLIT];
    for (int64_t r = 0; r < G; r++) {
        const uint16_t *q = j->q + t * j->q_token + (h * G + r) * j->q_head;
        for (int64_t d = 0; d < P; d++) s->q[r * P + d] = d < D ? bf16_to_float(q[d]) : 0.0f;
        max[r] = j->sinks ? j->sinks[h * G + r] : -__builtin_inff();
        sum[r] = 0.0f;
        memset(s->acc + r * Pv, 0, sizeof(float) * Pv);
    }
    int started = 0;
    for (int64_t start = first / SPLIT * SPLIT; start < keys; start += SPLIT) {
        const int64_t lo = start > first ? start : first;
        const int64_t hi = start + SPLIT < keys ? start + SPLIT : keys;
        const int64_t n = hi - lo;
        slots_of(j, table, lo, n, slots);
        scores_of(j, slots, h, s->q, n, s->scores);
        for (int64_t r = 0; r < G; r++) {
            const float *sc = s->scores + r * SPLIT;
            float top = max[r];
            for (int64_t i = 0; i < n; i++) top = sc[i] > top ? sc[i] : top;
            const float block_sum = exponentials(sc, n, top, s->probs + r * SPLIT);
            const float rescale = exp_nonpositive(max[r] - top);
            sum[r] = block_sum + rescale * sum[r];
            max[r] = top;
            if (started) {
                float *acc = s->acc + r * Pv;
                for (int64_t d = 0; d < Pv; d++) acc[d] = acc[d] * rescale;
            }
        }
        add_values(j, slots, h, s->probs, n, s->acc);
        started = 1;
    }
    for (int64_t r = 0; r < G; r++) {
        float total = sum[r];
        if (j->sinks) total = total + exp_nonpositive(j->sinks[h * G + r] - max[r]);
        const float inverse = 1.0f / total;
        uint16_t *o = j->out + t * j->o_token + (h * G + r) * j->o_head;
        const float *acc = s->acc + r * Pv;
        for (int64_t d = 0; d < Dv; d++) o[d] = float_to_bf16(acc[d] * inverse);
    }
}

/* Returns 0; -1 for shapes past the limits; -2 without memory; -3 for a token whose table
 * row, pages or slots lie outside the arrays given. Work items (token, KV head)
 * are independent, so how they fall to threads changes no bits; the threads are the OpenMP
 * pool torch's own operators use (the same libgomp), so none of them spins beside ours. */
int invariant_attention_bf16(const Job *j, int threads) {
    const int64_t G = j->group, P = padded(j->head_dim), Pv = padded(j->value_dim);
    if (G > MAX_GROUP || P > MAX_DIM || Pv > MAX_DIM) return -1;
    const int64_t items = j->tokens * j->kv_heads;
    for (int64_t t = 0; t < j->tokens; t++)
        if (!in_range(j, t)) return -3;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(| : failed)
    {
        float *buffer = (float *)malloc(sizeof(float) * (size_t)(G * (P + 2 * SPLIT + Pv)));
        if (!buffer) failed = 1;
        Scratch s = {buffer, buffer + G * P, buffer + G * (P + SPLIT), buffer + G * (P + 2 * SPLIT)};
#pragma omp for schedule(dynamic, 4)
        for (int64_t item = 0; item < items; item++)
            if (buffer) attend(j, &s, item / j->kv_heads, item % j->kv_heads);
        free(buffer);
    }
    return failed ? -2 : 0;
}

int job_size(void) { return (int)sizeof(Job); }
