/* test_abi.c: the binary interface that built callers and the Python
 * mirror (python/fmha/_lib.py) rely on. The layout of every public struct is
 * frozen here for LP64 targets (x86-64, AArch64): a field moved, resized or
 * inserted anywhere but at the end of fmha_problem fails this test, and so
 * does a status code renumbered. struct_size: a problem not filled by
 * fmha_problem_init is refused by every entry point with nothing written. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct frozen {
    const char *what;
    size_t got, want;
} frozen;

#define AT(s, f, want) {#s "." #f, offsetof(s, f), want}
#define SIZE(s, want) {"sizeof " #s, sizeof(s), want}

static void test_layout(void) {
    if (sizeof(void *) != 8 || sizeof(long) != 8) {
        printf("skip: the frozen layout is the LP64 one\n");
        return;
    }
    const frozen table[] = {
        SIZE(fmha_problem, 584), SIZE(fmha_masks, 112), SIZE(fmha_biases, 96),
        SIZE(fmha_param_grads, 56), SIZE(fmha_tile, 72), SIZE(fmha_mask_callback, 24),
        SIZE(fmha_bias_callback, 24),
        AT(fmha_problem, struct_size, 0), AT(fmha_problem, dtype, 8), AT(fmha_problem, batch, 16),
        AT(fmha_problem, heads_q, 24), AT(fmha_problem, heads_kv, 32), AT(fmha_problem, seq_q, 40),
        AT(fmha_problem, seq_kv, 48), AT(fmha_problem, head_dim, 56), AT(fmha_problem, head_dim_v, 64),
        AT(fmha_problem, scale, 72), AT(fmha_problem, causal, 76), AT(fmha_problem, strategy, 80),
        AT(fmha_problem, precision, 84), AT(fmha_problem, q_strides, 88), AT(fmha_problem, k_strides, 120),
        AT(fmha_problem, v_strides, 152), AT(fmha_problem, o_strides, 184), AT(fmha_problem, masks, 216),
        AT(fmha_problem, biases, 328), AT(fmha_problem, sinks, 424), AT(fmha_problem, block_table, 432),
        AT(fmha_problem, block_table_stride, 440), AT(fmha_problem, page_size, 448),
        AT(fmha_problem, num_pages, 456), AT(fmha_problem, dropout_p, 464),
        AT(fmha_problem, dropout_seed, 472), AT(fmha_problem, dropout_offset, 480), AT(fmha_problem, kv_dtype, 488),
        AT(fmha_problem, alignment, 496), AT(fmha_problem, k_format, 504), AT(fmha_problem, v_format, 512),
        AT(fmha_problem, k_scales, 520), AT(fmha_problem, v_scales, 528), AT(fmha_problem, k_scale_strides, 536),
        AT(fmha_problem, v_scale_strides, 560),
        AT(fmha_masks, window_left, 0), AT(fmha_masks, window_right, 8), AT(fmha_masks, kv_lengths, 16),
        AT(fmha_masks, q_lengths, 24), AT(fmha_masks, q_segment_ids, 32), AT(fmha_masks, kv_segment_ids, 40),
        AT(fmha_masks, dense, 48), AT(fmha_masks, dense_strides, 56), AT(fmha_masks, callback, 88),
        AT(fmha_biases, dense, 0), AT(fmha_biases, dense_strides, 8), AT(fmha_biases, alibi_slopes, 40),
        AT(fmha_biases, rel_table, 48), AT(fmha_biases, rel_num_buckets, 56),
        AT(fmha_biases, rel_max_distance, 60), AT(fmha_biases, rel_bidirectional, 64),
        AT(fmha_biases, softcap, 68), AT(fmha_biases, callback, 72),
        AT(fmha_param_grads, d_dense, 0), AT(fmha_param_grads, d_dense_strides, 8),
        AT(fmha_param_grads, d_alibi, 40), AT(fmha_param_grads, d_rel_table, 48),
        AT(fmha_tile, batch, 0), AT(fmha_tile, head_q, 8), AT(fmha_tile, q0, 16), AT(fmha_tile, nq, 24),
        AT(fmha_tile, k0, 32), AT(fmha_tile, nk, 40), AT(fmha_tile, q_stride, 48), AT(fmha_tile, k_stride, 56),
        AT(fmha_tile, thread, 64),
        AT(fmha_mask_callback, classify, 0), AT(fmha_mask_callback, fill, 8), AT(fmha_mask_callback, ctx, 16),
        AT(fmha_bias_callback, fill, 0), AT(fmha_bias_callback, accumulate_grad, 8),
        AT(fmha_bias_callback, ctx, 16),
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        tu_check(table[i].got == table[i].want, "ABI: %s is %zu, frozen at %zu", table[i].what, table[i].got,
                 table[i].want);
}

static void test_enums(void) {
    tu_check(FMHA_OK == 0 && FMHA_ERR_CALLBACK == 14 && FMHA_ERR_STRUCT_SIZE == 15 &&
                 FMHA_ERR_BAD_PAGE == 16 && FMHA_ERR_BAD_FILE == 17,
             "ABI: status codes keep their numbers (new ones are appended)");
    tu_check(FMHA_DTYPE_F32 == 0 && FMHA_DTYPE_BF16 == 1 && FMHA_DTYPE_F16 == 2, "ABI: dtype numbers");
    tu_check(FMHA_STRATEGY_AUTO == 0 && FMHA_STRATEGY_PORTABLE == 3, "ABI: strategy numbers");
    tu_check(FMHA_CAUSAL_BOTTOM_RIGHT == 2 && FMHA_PRECISION_FAST == 1 && FMHA_LAYOUT_BHSD == 1,
             "ABI: option numbers");
    tu_check(FMHA_KV_DTYPE_SAME == 0 && FMHA_KV_DTYPE_F32 == 1 && FMHA_KV_DTYPE_BF16 == 2 && FMHA_KV_DTYPE_F16 == 3,
             "ABI: kv dtype numbers (fmha_dtype + 1, 0 = the problem's)");
    tu_check(FMHA_ALIGN_CAUSAL == 0 && FMHA_ALIGN_TOP_LEFT == 1 && FMHA_ALIGN_BOTTOM_RIGHT == 2,
             "ABI: alignment numbers (0 = causal's)");
    tu_check(FMHA_KV_FORMAT_DTYPE == 0 && FMHA_KV_FORMAT_F32 == 1 && FMHA_KV_FORMAT_F16 == 3 &&
                 FMHA_KV_FORMAT_INT8 == 4 && FMHA_KV_FORMAT_FP8_E4M3 == 5 && FMHA_KV_FORMAT_FP8_E5M2 == 6 &&
                 FMHA_KV_FORMAT_Q8_0 == 7 && FMHA_KV_FORMAT_Q4_0 == 8,
             "ABI: kv format numbers (0 = kv_dtype's)");
}

/* Every entry point refuses a problem whose struct_size it does not know,
 * before it writes anything. */
static void test_struct_size(void) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, 5, 7, 8, 8, FMHA_LAYOUT_BSHD);
    tu_check(p.struct_size == sizeof(fmha_problem), "fmha_problem_init sets struct_size");
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1),
          *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
    float *o = tu_new_output(&p, 'o', 7.0f), *dq = tu_new_output(&p, 'q', 7.0f),
          *dk = tu_new_output(&p, 'k', 7.0f), *dv = tu_new_output(&p, 'v', 7.0f);
    float lse[10];
    for (int i = 0; i < 10; i++) lse[i] = 7.0f;
    /* 424, 432, 464, 488 and 496: earlier releases' sizes, still known (see test_earlier_releases) */
    size_t sizes[] = {0, 8, 416, sizeof(fmha_problem) - 4, sizeof(fmha_problem) + 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fmha_problem bad = p;
        bad.struct_size = sizes[i];
        size_t bytes = 12345;
        fmha_plan *plan = NULL;
        tu_check(fmha_problem_check(&bad) == FMHA_ERR_STRUCT_SIZE, "struct_size %zu: problem_check", sizes[i]);
        tu_check(fmha_forward_workspace_size(&bad, &bytes) == FMHA_ERR_STRUCT_SIZE && bytes == 12345,
                 "struct_size %zu: forward_workspace_size", sizes[i]);
        tu_check(fmha_backward_workspace_size(&bad, &bytes) == FMHA_ERR_STRUCT_SIZE && bytes == 12345,
                 "struct_size %zu: backward_workspace_size", sizes[i]);
        tu_check(fmha_forward(&bad, q, k, v, o, lse, NULL, 0) == FMHA_ERR_STRUCT_SIZE,
                 "struct_size %zu: forward", sizes[i]);
        tu_check(fmha_backward(&bad, q, k, v, d_o, d_o, lse, dq, dk, dv, NULL, NULL, 0) == FMHA_ERR_STRUCT_SIZE,
                 "struct_size %zu: backward", sizes[i]);
        tu_check(fmha_forward_backward(&bad, q, k, v, d_o, o, lse, dq, dk, dv, NULL) == FMHA_ERR_STRUCT_SIZE,
                 "struct_size %zu: forward_backward", sizes[i]);
        tu_check(fmha_plan_create(&bad, &plan) == FMHA_ERR_STRUCT_SIZE && plan == NULL,
                 "struct_size %zu: plan_create", sizes[i]);
    }
    int64_t n[4];
    tu_shape(&p, 'o', n);
    tu_check(tu_count_not(o, tu_span(p.o_strides, n), 7.0f) == 0 && tu_count_not(lse, 10, 7.0f) == 0,
             "struct_size errors write nothing");
    tu_check(strstr(fmha_status_string(FMHA_ERR_STRUCT_SIZE), "fmha_problem_init") != NULL,
             "the struct_size error names fmha_problem_init");
    free(q); free(k); free(v); free(d_o); free(o); free(dq); free(dk); free(dv);
}

/* A problem built against an earlier release (struct_size 424, no sinks;
 * 432, sinks but no block table; 464, no dropout; 488, no kv_dtype; 496, no
 * alignment; 504, no cache formats) runs as its prefix: what lies past it in memory is never read. */
static void test_earlier_releases(void) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, 5, 7, 8, 8, FMHA_LAYOUT_BSHD);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1),
          *v = tu_new_input(&p, 'v', -1, 1);
    float *o_new = tu_new_output(&p, 'o', 7.0f), *o_old = tu_new_output(&p, 'o', 7.0f);
    fmha_problem old = p;
    old.struct_size = 424;
    old.sinks = (const float *)&old; /* not an array: must not be read */
    tu_check(fmha_problem_check(&old) == FMHA_OK, "struct_size 424 is known");
    tu_check(fmha_forward(&p, q, k, v, o_new, NULL, NULL, 0) == FMHA_OK &&
                 fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK,
             "struct_size 424: forward");
    int64_t n[4];
    tu_shape(&p, 'o', n);
    tu_check(!memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 424 runs without sinks");
    float sinks[2] = {0.25f, -1.0f};
    p.sinks = sinks;
    old = p;
    old.struct_size = 432;
    old.block_table = (const int32_t *)&old; /* not a table: must not be read */
    old.page_size = -3;
    tu_check(fmha_problem_check(&old) == FMHA_OK, "struct_size 432 is known");
    tu_check(fmha_forward(&p, q, k, v, o_new, NULL, NULL, 0) == FMHA_OK &&
                 fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK &&
                 !memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 432 runs with sinks, without a block table");
    old = p;
    old.struct_size = 464;
    old.dropout_p = 0.5f; /* past the 464-byte prefix: must not be read */
    tu_check(fmha_problem_check(&old) == FMHA_OK && fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK &&
                 !memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 464 runs without dropout");
    old = p;
    old.struct_size = 488;
    old.kv_dtype = (fmha_kv_dtype)77; /* not a dtype: must not be read */
    tu_check(fmha_problem_check(&old) == FMHA_OK && fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK &&
                 !memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 488 runs without kv_dtype");
    old = p;
    old.struct_size = 496;
    old.alignment = 77; /* not an alignment: must not be read */
    tu_check(fmha_problem_check(&old) == FMHA_OK && fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK &&
                 !memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 496 runs without alignment");
    old = p;
    old.struct_size = 504;
    old.k_format = 77; /* not a format: must not be read */
    old.v_scales = (const float *)&old;
    tu_check(fmha_problem_check(&old) == FMHA_OK && fmha_forward(&old, q, k, v, o_old, NULL, NULL, 0) == FMHA_OK &&
                 !memcmp(o_new, o_old, tu_span(p.o_strides, n) * sizeof(float)),
             "struct_size 504 runs without cache formats");
    free(q); free(k); free(v); free(o_new); free(o_old);
}

int main(void) {
    tu_seed();
    test_layout();
    test_enums();
    test_struct_size();
    test_earlier_releases();
    return tu_finish();
}
