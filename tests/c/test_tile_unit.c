/* test_tile_unit.c: the software tile unit (src/uk/amx_emu/tile_unit.c)
 * and the tile configuration of the amx kernels.
 *   - configuration: load, read back, release; invalid ones fault;
 *   - loads and stores touch the configured rows and bytes only;
 *   - tdpbf16ps and tdpfp16ps against a float64 statement of their rule
 *     (each pair-step's a0 b0 + a1 b1 rounded once, then added to C;
 *     flushes as documented), on operands whose pair sums float64 holds
 *     exactly; the int8 products exactly, wrapping;
 *   - every fault (no configuration, an unconfigured tile, shapes that
 *     disagree, a tile named twice) aborts with its reason, in a child;
 *   - the amx and amx_emu tables' configuration, read back with sttilecfg
 *     after a job's begin hook and after a kernel's lazy configuration on
 *     a fresh thread (the tile rows of GCC's _tile_loadconfig were lost
 *     at -O2 and every tile instruction faulted);
 *   - on a CPU with AMX, the unit against the hardware: bit for bit with
 *     one pair-step per product and for the int8 products, within
 *     rounding with sixteen. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/cpu.h"
#include "test_util.h"

#if FMHA_HAVE_X86
#include "uk/amx/amx.h"
#include "uk/amx_emu/tile_unit.h"
#include "uk/scalar/bf16.h"

static fmha_tile_config config_all(unsigned rows, unsigned colsb) {
    fmha_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = (uint8_t)rows;
        c.colsb[t] = (uint16_t)colsb;
    }
    return c;
}

/* Tiles of a product C[M][N] += A[M][K groups] B[K][N]: tmm0 C, tmm1 A, tmm2 B. */
static fmha_tile_config config_product(unsigned m, unsigned n, unsigned k) {
    fmha_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = (uint8_t)m;
    c.colsb[0] = (uint16_t)(4 * n);
    c.rows[1] = (uint8_t)m;
    c.colsb[1] = (uint16_t)(4 * k);
    c.rows[2] = (uint8_t)k;
    c.colsb[2] = (uint16_t)(4 * n);
    return c;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_config(void) {
    fmha_tile_config c = config_all(16, 64), back;
    fmha_tile_unit_loadconfig(&c);
    fmha_tile_unit_storeconfig(&back);
    tu_check(!memcmp(&c, &back, sizeof c), "tile unit: sttilecfg gives back the configuration loaded");
    fmha_tile_unit_release();
    memset(&back, 0xA5, sizeof back);
    fmha_tile_unit_storeconfig(&back);
    fmha_tile_config zero;
    memset(&zero, 0, sizeof zero);
    tu_check(!memcmp(&zero, &back, sizeof zero), "tile unit: after tilerelease sttilecfg stores zeros");
}

/* Loads of 5 rows x 12 bytes from a strided buffer: the rest of the tile is
 * zero; a store writes those rows and bytes only. */
static void test_load_store(void) {
    fmha_tile_config c = config_all(16, 64);
    c.rows[3] = 5;
    c.colsb[3] = 12;
    fmha_tile_unit_loadconfig(&c);
    uint8_t src[16 * 100], dst[16 * 100], full[16 * 64];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 7 + 1);
    fmha_tile_unit_load(3, src, 100);
    memset(dst, 0xEE, sizeof dst);
    fmha_tile_unit_store(3, dst, 100);
    size_t wrong = 0;
    for (size_t r = 0; r < 16; r++)
        for (size_t j = 0; j < 100; j++) wrong += dst[r * 100 + j] != (r < 5 && j < 12 ? src[r * 100 + j] : 0xEE);
    tu_check(wrong == 0, "tile unit: a 5 x 12 store wrote its rows and bytes only (%zu bytes wrong)", wrong);
    /* the same tile seen whole: zeros past the configured part */
    c.rows[3] = 16;
    c.colsb[3] = 64;
    fmha_tile_unit_loadconfig(&c); /* zeroes the tiles: load again under the narrow shape first */
    c.rows[3] = 5;
    c.colsb[3] = 12;
    fmha_tile_unit_loadconfig(&c);
    memset(full, 0x77, sizeof full);
    fmha_tile_unit_load(3, src, 100);
    fmha_tile_unit_store(3, full, 64);
    size_t inside = 0;
    for (size_t r = 0; r < 5; r++)
        for (size_t j = 0; j < 12; j++) inside += full[r * 64 + j] == src[r * 100 + j];
    tu_check(inside == 60, "tile unit: a strided load reads each row from base + r * stride");
    fmha_tile_unit_release();
}

/* bf16 of a float in [-2, 2] with a limited exponent (pair sums exact in
 * float64) and its value. */
static uint16_t small_bf16(void) { return fmha_bf16_round__scalar((float)tu_uniform(-2.0, 2.0)); }

static double bf16_val(uint16_t h, int flush) {
    if (flush && (h & 0x7F80u) == 0) return 0.0; /* subnormal or zero: zero */
    return (double)bits_f32((uint32_t)h << 16);
}

static float flush_f32(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

/* The rule in float64: C read flushed; each pair-step's two products
 * (exact, or zero below float32's normal range) summed exactly, rounded
 * once to float32 (a zero sum is +0) and flushed, then added to C
 * (float32, flushed). */
static double flush_product(double p) { return fabs(p) < 0x1p-126 ? 0.0 : p; }
static void rule_bf16(unsigned m, unsigned n, unsigned k, const uint32_t *a, const uint32_t *b, float *c) {
    for (unsigned i = 0; i < m; i++)
        for (unsigned j = 0; j < n; j++) {
            float acc = flush_f32(c[i * 16 + j]);
            for (unsigned p = 0; p < k; p++) {
                uint32_t x = a[i * 16 + p], y = b[p * 16 + j];
                double s = flush_product(bf16_val((uint16_t)x, 1) * bf16_val((uint16_t)y, 1)) +
                           flush_product(bf16_val((uint16_t)(x >> 16), 1) * bf16_val((uint16_t)(y >> 16), 1));
                acc = flush_f32(acc + flush_f32((float)(s + 0.0)));
            }
            c[i * 16 + j] = acc;
        }
}

/* Runs C += A B on the unit with tiles of the given shape; a, b, c are
 * 16-word rows. */
static void unit_product(void (*op)(int, int, int), unsigned m, unsigned n, unsigned k, const uint32_t *a,
                         const uint32_t *b, void *c) {
    fmha_tile_config cfg = config_product(m, n, k);
    fmha_tile_unit_loadconfig(&cfg);
    fmha_tile_unit_load(0, c, 64);
    fmha_tile_unit_load(1, a, 64);
    fmha_tile_unit_load(2, b, 64);
    op(0, 1, 2);
    fmha_tile_unit_store(0, c, 64);
    fmha_tile_unit_release();
}

static void test_dpbf16ps(void) {
    static const unsigned shapes[][3] = {{16, 16, 16}, {1, 1, 1}, {3, 7, 5}, {16, 16, 1}, {9, 16, 11}};
    size_t wrong = 0, total = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const unsigned m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        uint32_t a[256] = {0}, b[256] = {0};
        float c[256] = {0}, want[256];
        for (unsigned i = 0; i < m; i++)
            for (unsigned p = 0; p < k; p++) a[i * 16 + p] = small_bf16() | (uint32_t)small_bf16() << 16;
        for (unsigned p = 0; p < k; p++)
            for (unsigned j = 0; j < n; j++) b[p * 16 + j] = small_bf16() | (uint32_t)small_bf16() << 16;
        for (unsigned i = 0; i < m * 16; i++) c[i] = (float)tu_uniform(-8.0, 8.0);
        memcpy(want, c, sizeof c);
        rule_bf16(m, n, k, a, b, want);
        unit_product(fmha_tile_unit_dpbf16ps, m, n, k, a, b, c);
        for (unsigned i = 0; i < m; i++)
            for (unsigned j = 0; j < n; j++, total++) wrong += f32_bits(c[i * 16 + j]) != f32_bits(want[i * 16 + j]);
    }
    tu_check(wrong == 0, "tile unit: tdpbf16ps follows the pair rule bit for bit (%zu of %zu differ)", wrong, total);

    /* flushes: a subnormal bf16 input counts as zero; a subnormal sum is zero */
    uint32_t a[256] = {0}, b[256] = {0};
    float c[256] = {0};
    a[0] = 0x0040u | (uint32_t)0x3F80u << 16; /* (subnormal, 1) */
    b[0] = 0x7F00u | (uint32_t)0x3F80u << 16; /* (2^127, 1) */
    unit_product(fmha_tile_unit_dpbf16ps, 1, 1, 1, a, b, c);
    tu_check(c[0] == 1.0f, "tile unit: tdpbf16ps flushes a subnormal input (got %a, want 1)", (double)c[0]);
    a[0] = 0x0180u; /* 2^-124 */
    b[0] = 0x1F80u; /* 2^-64: product 2^-188 */
    c[0] = 0.0f;
    unit_product(fmha_tile_unit_dpbf16ps, 1, 1, 1, a, b, c);
    tu_check(c[0] == 0.0f, "tile unit: tdpbf16ps flushes a result below the normal range (got %a)", (double)c[0]);
    a[0] = 0x0180u; /* 2^-124 */
    b[0] = 0x3E80u; /* 2^-2: product 2^-126, the least normal */
    c[0] = 0.0f;
    unit_product(fmha_tile_unit_dpbf16ps, 1, 1, 1, a, b, c);
    tu_check(c[0] == 0x1p-126f, "tile unit: tdpbf16ps keeps the least normal (got %a)", (double)c[0]);
}

static uint16_t f16_bits_of(float x) {
    /* exact for the values used here: small integers over powers of two */
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static double f16_val(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, 2);
    return (double)h;
}

static void test_dpfp16ps(void) {
    const unsigned m = 7, n = 13, k = 9;
    uint32_t a[256] = {0}, b[256] = {0};
    float c[256] = {0}, want[256];
    for (unsigned i = 0; i < m; i++)
        for (unsigned p = 0; p < k; p++)
            a[i * 16 + p] = f16_bits_of((float)tu_uniform(-3, 3)) | (uint32_t)f16_bits_of((float)tu_uniform(-3, 3)) << 16;
    for (unsigned p = 0; p < k; p++)
        for (unsigned j = 0; j < n; j++)
            b[p * 16 + j] = f16_bits_of((float)tu_uniform(-3, 3)) | (uint32_t)f16_bits_of((float)tu_uniform(-3, 3)) << 16;
    a[0] = 0x0001u | (uint32_t)0x3C00u << 16; /* (the least f16 subnormal, 1): kept */
    for (unsigned i = 0; i < m * 16; i++) c[i] = (float)tu_uniform(-8.0, 8.0);
    memcpy(want, c, sizeof c);
    for (unsigned i = 0; i < m; i++)
        for (unsigned j = 0; j < n; j++) {
            float acc = flush_f32(want[i * 16 + j]);
            for (unsigned p = 0; p < k; p++) {
                uint32_t x = a[i * 16 + p], y = b[p * 16 + j];
                double s = f16_val((uint16_t)x) * f16_val((uint16_t)y) +
                           f16_val((uint16_t)(x >> 16)) * f16_val((uint16_t)(y >> 16));
                acc = flush_f32(acc + flush_f32((float)(s + 0.0)));
            }
            want[i * 16 + j] = acc;
        }
    unit_product(fmha_tile_unit_dpfp16ps, m, n, k, a, b, c);
    size_t wrong = 0;
    for (unsigned i = 0; i < m; i++)
        for (unsigned j = 0; j < n; j++) wrong += f32_bits(c[i * 16 + j]) != f32_bits(want[i * 16 + j]);
    tu_check(wrong == 0, "tile unit: tdpfp16ps follows the pair rule, f16 subnormals kept (%zu differ)", wrong);
}

static void test_int8(void) {
    static const struct {
        void (*op)(int, int, int);
        const char *name;
        int a_signed, b_signed;
    } ops[] = {{fmha_tile_unit_dpbssd, "tdpbssd", 1, 1},
               {fmha_tile_unit_dpbsud, "tdpbsud", 1, 0},
               {fmha_tile_unit_dpbusd, "tdpbusd", 0, 1},
               {fmha_tile_unit_dpbuud, "tdpbuud", 0, 0}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        const unsigned m = 16, n = 16, k = 16;
        uint32_t a[256], b[256];
        int32_t c[256], want[256];
        for (int i = 0; i < 256; i++) {
            a[i] = (uint32_t)tu_next();
            b[i] = (uint32_t)tu_next();
            c[i] = (int32_t)(uint32_t)tu_next(); /* near the ends too: the sum wraps */
        }
        for (unsigned i = 0; i < m; i++)
            for (unsigned j = 0; j < n; j++) {
                int64_t s = c[i * 16 + j];
                for (unsigned p = 0; p < k; p++)
                    for (unsigned q = 0; q < 4; q++) {
                        uint8_t x = (uint8_t)(a[i * 16 + p] >> 8 * q), y = (uint8_t)(b[p * 16 + j] >> 8 * q);
                        s += (int64_t)(ops[o].a_signed ? (int8_t)x : x) * (ops[o].b_signed ? (int8_t)y : y);
                    }
                want[i * 16 + j] = (int32_t)(uint32_t)(uint64_t)s; /* modulo 2^32 */
            }
        unit_product(ops[o].op, m, n, k, a, b, c);
        tu_check(!memcmp(c, want, sizeof c), "tile unit: %s exact, wrapping", ops[o].name);
    }
}

/* ---- faults ---- */

typedef void (*fault_fn)(void);

static void fault_no_config(void) { fmha_tile_unit_zero(0); }
static void fault_bad_palette(void) {
    fmha_tile_config c = config_all(16, 64);
    c.palette = 2;
    fmha_tile_unit_loadconfig(&c);
}
static void fault_too_many_rows(void) {
    fmha_tile_config c = config_all(16, 64);
    c.rows[2] = 17;
    fmha_tile_unit_loadconfig(&c);
}
static void fault_half_shape(void) {
    fmha_tile_config c = config_all(16, 64);
    c.colsb[5] = 0;
    fmha_tile_unit_loadconfig(&c);
}
static void fault_unconfigured_tile(void) {
    fmha_tile_config c = config_all(16, 64);
    c.rows[6] = 0;
    c.colsb[6] = 0;
    fmha_tile_unit_loadconfig(&c);
    static char buf[1024];
    fmha_tile_unit_load(6, buf, 64);
}
static void fault_k_mismatch(void) {
    fmha_tile_config c = config_product(16, 16, 16);
    c.rows[2] = 8; /* B has 8 rows, A 16 groups */
    fmha_tile_unit_loadconfig(&c);
    fmha_tile_unit_dpbf16ps(0, 1, 2);
}
static void fault_rows_mismatch(void) {
    fmha_tile_config c = config_product(16, 16, 16);
    c.rows[0] = 8;
    fmha_tile_unit_loadconfig(&c);
    fmha_tile_unit_dpbssd(0, 1, 2);
}
static void fault_same_tile(void) {
    fmha_tile_config c = config_all(16, 64);
    fmha_tile_unit_loadconfig(&c);
    fmha_tile_unit_dpbf16ps(0, 1, 1);
}
static void fault_after_release(void) {
    fmha_tile_config c = config_all(16, 64);
    fmha_tile_unit_loadconfig(&c);
    fmha_tile_unit_release();
    static char buf[1024];
    fmha_tile_unit_store(0, buf, 64);
}

/* Runs fn in a child: it must abort, printing `reason` on stderr. */
static void expect_fault(fault_fn fn, const char *what, const char *reason) {
    int fds[2];
    if (pipe(fds) != 0) {
        tu_check(0, "pipe failed");
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0); /* no fault: the parent sees exit status 0 */
    }
    close(fds[1]);
    char msg[1024];
    size_t len = 0;
    ssize_t got;
    while (len + 1 < sizeof msg && (got = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0) len += (size_t)got;
    msg[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    tu_check(aborted && strstr(msg, "fmha amx_emu") && strstr(msg, reason),
             "tile unit: %s aborts with its reason (status %d, message \"%s\")", what, status, msg);
}

static void test_faults(void) {
    expect_fault(fault_no_config, "tilezero before ldtilecfg", "no tile configuration");
    expect_fault(fault_bad_palette, "palette 2", "palette 2");
    expect_fault(fault_too_many_rows, "17 rows", "over 16 x 64");
    expect_fault(fault_half_shape, "rows without bytes", "both or neither");
    expect_fault(fault_unconfigured_tile, "a load into an unconfigured tile", "tmm6 is not configured");
    expect_fault(fault_k_mismatch, "A's groups against B's rows", "A has 16 groups a row, B 8 rows");
    expect_fault(fault_rows_mismatch, "C's rows against A's", "C has 8 rows, A 16");
    expect_fault(fault_same_tile, "a tile named twice", "named twice");
    expect_fault(fault_after_release, "a store after tilerelease", "no tile configuration");
}

/* ---- the tables' configuration ---- */

typedef struct table_tiles {
    const char *isa;
    void (*begin)(void), (*end)(void);
    const fmha_tile_config *(*config)(void);
    fmha_bf16_gemm_ukernel_fn gemm;
    void (*read_back)(fmha_tile_config *);
} table_tiles;

static void unit_read_back(fmha_tile_config *c) { fmha_tile_unit_storeconfig(c); }

#if FMHA_HAVE_AMX
static void amx_read_back(fmha_tile_config *c) { TILE_STORECONFIG(c); }
#endif

/* The configuration every tile of the kernels needs: palette 1 and all of
 * tmm0..7 16 rows x 64 bytes (the sizes the kernels load). */
static int config_serves_kernels(const fmha_tile_config *c) {
    if (c->palette != 1) return 0;
    for (int t = 0; t < 8; t++)
        if (c->rows[t] != 16 || c->colsb[t] != 64) return 0;
    return 1;
}

static void *lazy_config_thread(void *arg) {
    const table_tiles *t = arg;
    static fmha_tile_config got;
    uint32_t a[16] = {0}, b[64] = {0};
    float c[64];
    t->gemm(1, 1, a, 1, 1, b, 64, c, 64, FMHA_UK_STORE, NULL, 1.0f);
    t->read_back(&got);
    return &got;
}

static void test_table_config(const table_tiles *t) {
    const fmha_tile_config *want = t->config();
    tu_check(config_serves_kernels(want), "%s: the constant configuration gives all 8 tiles 16 rows x 64 bytes", t->isa);
    fmha_tile_config got;
    t->begin();
    t->read_back(&got);
    tu_check(!memcmp(&got, want, sizeof got), "%s: sttilecfg after the thread hook reads back the configuration "
             "(palette %u, tmm0 %u x %u, tmm5 %u x %u)", t->isa, got.palette, got.rows[0], got.colsb[0], got.rows[5],
             got.colsb[5]);
    t->end();
    t->read_back(&got);
    tu_check(got.palette == 0, "%s: the end hook releases the tiles", t->isa);
    pthread_t th;
    void *res = NULL;
    pthread_create(&th, NULL, lazy_config_thread, (void *)t);
    pthread_join(th, &res);
    tu_check(!memcmp(res, want, sizeof got), "%s: a kernel called outside a job configures its thread", t->isa);
}

#if FMHA_HAVE_AMX
/* ---- the unit against the hardware ---- */

/* tmm0 C, tmm1 A, tmm2 B on the hardware, shapes from cfg. */
static void hw_product(const char *op, const fmha_tile_config *cfg, const uint32_t *a, const uint32_t *b, void *c) {
    TILE_LOADCONFIG(cfg);
    TILE_LOAD(0, c, 64);
    TILE_LOAD(1, a, 64);
    TILE_LOAD(2, b, 64);
    if (!strcmp(op, "bf16")) TILE_DPBF16PS(0, 1, 2);
    else if (!strcmp(op, "ssd")) TILE_DPBSSD(0, 1, 2);
    else TILE_DPBUSD(0, 1, 2);
    TILE_STORE(0, c, 64);
    TILE_RELEASE();
}

static uint16_t any_class_bf16(void) {
    switch (tu_int(0, 5)) {
    case 0: return (uint16_t)tu_next();                             /* any bits */
    case 1: return (uint16_t)(tu_int(0, 0x7F) | (tu_int(0, 1) << 15)); /* subnormal */
    default: return small_bf16();
    }
}

static void test_against_hardware(void) {
    /* one pair-step: the rule is exact */
    const int rounds = (int)tu_quick_pick(200, 20);
    size_t differ = 0, total = 0;
    for (int r = 0; r < rounds; r++) {
        uint32_t a[256] = {0}, b[256] = {0};
        float c_hw[256], c_emu[256];
        for (int i = 0; i < 256; i++) {
            a[i] = any_class_bf16() | (uint32_t)any_class_bf16() << 16;
            b[i] = any_class_bf16() | (uint32_t)any_class_bf16() << 16;
            c_hw[i] = r % 2 ? (float)tu_uniform(-4, 4) : bits_f32((uint32_t)tu_next());
        }
        memcpy(c_emu, c_hw, sizeof c_hw);
        float c_in[256];
        memcpy(c_in, c_hw, sizeof c_hw);
        fmha_tile_config cfg = config_product(16, 16, 1);
        hw_product("bf16", &cfg, a, b, c_hw);
        unit_product(fmha_tile_unit_dpbf16ps, 16, 16, 1, a, b, c_emu);
        for (int i = 0; i < 256; i++, total++) {
            int same = f32_bits(c_hw[i]) == f32_bits(c_emu[i]) || (isnan(c_hw[i]) && isnan(c_emu[i]));
            if (!same && differ < 4)
                printf("  one pair: hardware %a, unit %a (A %08X, B %08X, C %a)\n", (double)c_hw[i], (double)c_emu[i],
                       (unsigned)a[(i / 16) * 16], (unsigned)b[i % 16], (double)c_in[i]);
            differ += !same;
        }
    }
    tu_check(differ == 0, "tile unit vs AMX: tdpbf16ps with one pair-step bit for bit (%zu of %zu differ)", differ,
             total);

    /* sixteen pair-steps: within the roundings of the sums */
    double worst = 0.0;
    for (int r = 0; r < rounds; r++) {
        uint32_t a[256], b[256];
        float c_hw[256], c_emu[256];
        double mag[256] = {0};
        for (int i = 0; i < 256; i++) {
            a[i] = small_bf16() | (uint32_t)small_bf16() << 16;
            b[i] = small_bf16() | (uint32_t)small_bf16() << 16;
            c_hw[i] = (float)tu_uniform(-4, 4);
        }
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                mag[i * 16 + j] = fabs(c_hw[i * 16 + j]);
                for (int p = 0; p < 16; p++) {
                    uint32_t x = a[i * 16 + p], y = b[p * 16 + j];
                    mag[i * 16 + j] += fabs(bf16_val((uint16_t)x, 1) * bf16_val((uint16_t)y, 1)) +
                                       fabs(bf16_val((uint16_t)(x >> 16), 1) * bf16_val((uint16_t)(y >> 16), 1));
                }
            }
        memcpy(c_emu, c_hw, sizeof c_hw);
        fmha_tile_config cfg = config_product(16, 16, 16);
        hw_product("bf16", &cfg, a, b, c_hw);
        unit_product(fmha_tile_unit_dpbf16ps, 16, 16, 16, a, b, c_emu);
        for (int i = 0; i < 256; i++) {
            /* each side: up to 2 roundings a step, 2^-24 each */
            double ratio = fabs((double)c_hw[i] - c_emu[i]) / (4.0 * 16 * 0x1p-24 * mag[i] + 1e-30);
            if (!(ratio <= worst)) worst = ratio;
        }
    }
    tu_check(worst <= 1.0, "tile unit vs AMX: tdpbf16ps with 16 pair-steps within 64 u |terms| (worst %.3g)", worst);

    /* int8: exact */
    size_t int_differ = 0;
    for (int r = 0; r < rounds; r++) {
        uint32_t a[256], b[256], c_hw[256], c_emu[256];
        for (int i = 0; i < 256; i++) {
            a[i] = (uint32_t)tu_next();
            b[i] = (uint32_t)tu_next();
            c_hw[i] = (uint32_t)tu_next();
        }
        const char *op = r % 2 ? "ssd" : "usd";
        memcpy(c_emu, c_hw, sizeof c_hw);
        fmha_tile_config cfg = config_product(16, 16, 16);
        hw_product(op, &cfg, a, b, c_hw);
        unit_product(r % 2 ? fmha_tile_unit_dpbssd : fmha_tile_unit_dpbusd, 16, 16, 16, a, b, c_emu);
        int_differ += memcmp(c_hw, c_emu, sizeof c_hw) != 0;
    }
    tu_check(int_differ == 0, "tile unit vs AMX: tdpbssd/tdpbusd bit for bit (%zu of %d products differ)",
             int_differ, rounds);
}
#endif

#endif /* FMHA_HAVE_X86 */

static int isa_runs(const char *name) {
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        if (!strcmp(isa->name, name)) return fmha_isa_supported(isa);
    }
    return 0;
}

int main(void) {
    tu_seed();
#if !FMHA_HAVE_X86
    printf("skip: the tile unit is x86-64's\n");
    (void)isa_runs;
    return tu_finish();
#else
    if (!isa_runs("amx_emu")) {
        printf("skip: the tile unit needs AVX512_BF16 (amx_emu), which this CPU lacks or FMHA_TEST_ISAS leaves out\n");
        return tu_finish();
    }
    test_config();
    test_load_store();
    test_dpbf16ps();
    test_dpfp16ps();
    test_int8();
    test_faults();
    const table_tiles emu = {"amx_emu", fmha_amx_thread_begin__amx_emu, fmha_amx_thread_end__amx_emu,
                             fmha_amx_tile_config__amx_emu, fmha_bf16_gemm_ukernel_16x64__amx_emu, unit_read_back};
    test_table_config(&emu);
#if FMHA_HAVE_AMX
    if (isa_runs("amx")) {
        const table_tiles hw = {"amx", fmha_amx_thread_begin__amx, fmha_amx_thread_end__amx,
                                fmha_amx_tile_config__amx, fmha_bf16_gemm_ukernel_16x64__amx, amx_read_back};
        test_table_config(&hw);
        test_against_hardware();
    } else {
        printf("skip: AMX hardware checks (this CPU or OS has no AMX-BF16 tiles)\n");
    }
#else
    printf("skip: AMX hardware checks (built without the amx table)\n");
#endif
    return tu_finish();
#endif /* FMHA_HAVE_X86 */
}
