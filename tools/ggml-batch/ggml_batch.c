/* ggml_batch.c: ggml's CPU flash attention (ggml_flash_attn_ext, the kernel
 * under llama.cpp) on a batch of sequences of uneven lengths, each decoding
 * Sq new positions, beside fmha-bench's decode rows with the same shape and
 * the same lengths (fmha-bench --variants decode --batch B --seq-q Sq
 * --kv-lengths uniform:F). A measuring tool: nothing in fmha's build uses
 * it, and it builds only against a ggml the user built (README.md here).
 *
 * ggml has no per-sequence lengths: the batch is its 4th dimension, K and V
 * [D, Skv, Hkv, B] hold Skv keys a sequence, and a mask [Skv, Sq, 1, B] of
 * f16 0 / -inf hides keys past a sequence's length and, bottom-right, keys
 * after a query's position. ggml's CPU kernel skips a key whose mask is
 * -inf, so the keys it reads are those of each sequence's length.
 *   usage: ggml-batch D Sq Skv H Hkv kvtype B F reps threads
 *          kvtype: f32, f16, bf16, q8_0, q4_0; F as --kv-lengths uniform:F
 * Prints the lengths' mean, the median ms, GB/s of K and V as stored over
 * the keys each sequence caches (fmha-bench's KV_GB/s), and the largest
 * error of heads 0 and H - 1 against float64 attention over the cache's
 * values as ggml stores them (so the mask is checked, not the format). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../fmha-bench/kv_lengths.h" /* fmha-bench's generator and lengths */
#include "ggml-cpu.h"
#include "ggml.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static float uniform(uint64_t *state) { /* [-1, 1) */
    return (float)((double)(splitmix64(state) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int type_of(const char *name, enum ggml_type *t) {
    static const struct { const char *name; enum ggml_type type; } types[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(name, types[i].name) == 0) return *t = types[i].type, 0;
    return -1;
}

/* rows of D floats into a tensor of type t, row by row */
static void fill(struct ggml_tensor *x, enum ggml_type t, const float *src, int64_t rows, int64_t d) {
    if (t == GGML_TYPE_F32) memcpy(x->data, src, (size_t)(rows * d) * sizeof(float));
    else if (t == GGML_TYPE_F16) ggml_fp32_to_fp16_row(src, x->data, rows * d);
    else if (t == GGML_TYPE_BF16) ggml_fp32_to_bf16_row(src, x->data, rows * d);
    else ggml_quantize_chunk(t, src, x->data, 0, rows, d, NULL);
}

/* The largest |O - O_ref| over heads 0 and H - 1 of every sequence, the
 * reference in float64 over K and V read back from ggml's storage; o is
 * [D, H, Sq, B]. */
static double max_error(const struct ggml_tensor *q, const struct ggml_tensor *k, const struct ggml_tensor *v,
                        const struct ggml_tensor *o, const int64_t *len, enum ggml_type kv_type) {
    const int64_t D = q->ne[0], Sq = q->ne[1], H = q->ne[2], B = q->ne[3], Skv = k->ne[1], Hkv = k->ne[2];
    const struct ggml_type_traits *tt = ggml_get_type_traits(kv_type);
    float *kr = malloc((size_t)(Skv * D) * sizeof *kr), *vr = malloc((size_t)(Skv * D) * sizeof *vr);
    double *s = malloc((size_t)Skv * sizeof *s), worst = 0;
    const size_t row = ggml_row_size(kv_type, D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h += H > 1 ? H - 1 : 1) {
            const int64_t hk = h / (H / Hkv);
            for (int64_t j = 0; j < Skv; j++) {
                const size_t at = (size_t)((b * Hkv + hk) * Skv + j) * row;
                if (kv_type == GGML_TYPE_F32) {
                    memcpy(kr + j * D, (const char *)k->data + at, row);
                    memcpy(vr + j * D, (const char *)v->data + at, row);
                } else {
                    tt->to_float((const char *)k->data + at, kr + j * D, D);
                    tt->to_float((const char *)v->data + at, vr + j * D, D);
                }
            }
            for (int64_t i = 0; i < Sq; i++) {
                const float *qi = (const float *)q->data + ((b * H + h) * Sq + i) * D;
                const int64_t seen = i + len[b] - Sq + 1;
                double mx = -INFINITY, den = 0;
                for (int64_t j = 0; j < seen; j++) {
                    double acc = 0;
                    for (int64_t e = 0; e < D; e++) acc += (double)qi[e] * kr[j * D + e];
                    s[j] = acc / sqrt((double)D);
                    if (s[j] > mx) mx = s[j];
                }
                for (int64_t j = 0; j < seen; j++) den += s[j] = exp(s[j] - mx);
                for (int64_t e = 0; e < D; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < seen; j++) acc += s[j] * vr[j * D + e];
                    const double got = ((const float *)o->data)[((b * Sq + i) * H + h) * D + e];
                    if (fabs(got - acc / den) > worst) worst = fabs(got - acc / den);
                }
            }
        }
    free(kr);
    free(vr);
    free(s);
    return worst;
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: ggml-batch D Sq Skv H Hkv kvtype B F reps threads\n");
        return 2;
    }
    const int64_t D = atoll(argv[1]), Sq = atoll(argv[2]), Skv = atoll(argv[3]), H = atoll(argv[4]),
                  Hkv = atoll(argv[5]), B = atoll(argv[7]);
    const double F = atof(argv[8]);
    const int reps = atoi(argv[9]), threads = atoi(argv[10]);
    enum ggml_type kv_type;
    if (D < 1 || Sq < 1 || Skv < Sq || H < 1 || Hkv < 1 || H % Hkv || B < 1 || !(F > 0 && F <= 1) || reps < 1 ||
        threads < 1 || type_of(argv[6], &kv_type) != 0 || (ggml_is_quantized(kv_type) && D % 32)) {
        fprintf(stderr, "ggml-batch: bad arguments (see the usage in ggml_batch.c)\n");
        return 2;
    }
    /* the lengths, as fmha-bench draws them: sequence 0 caches Skv keys */
    int64_t *len = malloc((size_t)B * sizeof *len);
    uint64_t len_state = BENCH_LENGTHS_SEED;
    double mean = 0;
    for (int64_t b = 0; b < B; b++) {
        len[b] = bench_kv_length(&len_state, b, Skv, F);
        if (len[b] < Sq) len[b] = Sq;
        mean += (double)len[b] / (double)B;
    }
    const size_t nq = (size_t)(D * Sq * H * B), nkv = (size_t)(D * Skv * Hkv * B);
    struct ggml_init_params ip = {nq * 8 + nkv * 8 + (size_t)(Skv * Sq * B) * 2 + 64 * ggml_tensor_overhead() +
                                      ggml_graph_overhead() + (1u << 20),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    /* q [D, Sq, H, B] f32; k, v [D, Skv, Hkv, B]; mask [Skv, Sq, 1, B] f16 */
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Sq, H, B);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, kv_type, D, Skv, Hkv, B);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, kv_type, D, Skv, Hkv, B);
    struct ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, Skv, Sq, 1, B);
    uint64_t state = BENCH_INPUT_SEED;
    float *x = malloc(nkv * sizeof *x);
    for (size_t i = 0; i < nq; i++) ((float *)q->data)[i] = uniform(&state);
    for (size_t i = 0; i < nkv; i++) x[i] = uniform(&state);
    fill(k, kv_type, x, (int64_t)(nkv / (size_t)D), D);
    for (size_t i = 0; i < nkv; i++) x[i] = uniform(&state);
    fill(v, kv_type, x, (int64_t)(nkv / (size_t)D), D);
    free(x);
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), hidden = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t j = 0; j < Skv; j++) /* bottom-right within the sequence's own keys */
                ((ggml_fp16_t *)mask->data)[(b * Sq + i) * Skv + j] = j <= i + len[b] - Sq ? zero : hidden;
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, o);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
    struct ggml_cplan plan = ggml_graph_plan(graph, threads, pool);
    plan.work_data = malloc(plan.work_size + 64);
    for (int w = 0; w < 2; w++) ggml_graph_compute(graph, &plan);
    double *t = malloc((size_t)reps * sizeof *t);
    for (int r = 0; r < reps; r++) {
        const double t0 = now_ms();
        ggml_graph_compute(graph, &plan);
        t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, by_value);
    const double median = t[reps / 2];
    /* bytes of K and V as stored, over the keys each sequence caches */
    const double kv_bytes = 2.0 * (double)ggml_row_size(kv_type, D) * (double)Hkv * mean * (double)B;
    printf("ggml-batch D=%lld Sq=%lld Skv=%lld H=%lld Hkv=%lld kv=%s B=%lld F=%g threads=%d: kv_len_mean %.1f, "
           "median %.3f ms (min %.3f), %.2f GB/s of K and V\n",
           (long long)D, (long long)Sq, (long long)Skv, (long long)H, (long long)Hkv, argv[6], (long long)B, F,
           threads, mean, median, t[0], kv_bytes / median / 1e6);
    ggml_threadpool_free(pool);
    printf("ggml-batch: max abs error against float64 %.2e\n", max_error(q, k, v, o, len, kv_type));
    free(plan.work_data);
    free(t);
    free(len);
    ggml_free(ctx);
    return 0;
}
