/* compose.c: an ISA's parts made into one complete kernel table. Every
 * fallback of ukernel.h is applied here and nowhere else: the drivers and
 * planning read a composed table and never test a kernel for NULL. */
#include "ukernel.h"

/* Takes `from`'s kernel where `to` has none. */
#define FMHA_FILL(to, from, field)                                                                                     \
    do {                                                                                                               \
        if (!(to).field) (to).field = (from).field;                                                                    \
    } while (0)

void fmha_ukernels_compose(const fmha_isa_parts *parts, fmha_ukernels *out) {
    const fmha_isa_parts *spec = &fmha_isa_scalar;
    *out = (fmha_ukernels){.isa = parts->isa, .tile = *parts->tile};
    if (!out->tile.softmax_lowp) out->tile.softmax_lowp = out->tile.softmax;
    if (!out->tile.exp_sub_lowp) out->tile.exp_sub_lowp = out->tile.exp_sub;

    const fmha_uk_bf16 *b = parts->bf16;
    if (b && b->gemm && b->pair_rows && b->pair_rows_split && b->pack_rows) {
        out->bf16 = *b;
        if (!out->bf16.mr) out->bf16.mr = out->tile.mr;
    }

    if (parts->rows) out->rows = *parts->rows;
    FMHA_FILL(out->rows, *spec->rows, add_transposed);
    FMHA_FILL(out->rows, *spec->rows, finish);
    FMHA_FILL(out->rows, *spec->rows, transpose);
    FMHA_FILL(out->rows, *spec->rows, to_bf16);
    FMHA_FILL(out->rows, *spec->rows, interleave_u16);
    FMHA_FILL(out->rows, *spec->rows, dropout);
    FMHA_FILL(out->rows, *spec->rows, axpy);
    FMHA_FILL(out->rows, *spec->rows, scale_columns);
    FMHA_FILL(out->rows, *spec->rows, nonfinite);

    const fmha_uk_cache *f32 = parts->cache[FMHA_FORMAT_F32];
    if (parts->decode && parts->decode->softmax && f32 && f32->scores && f32->values) out->decode = *parts->decode;

    for (int f = 0; f < FMHA_FORMAT_COUNT; f++) {
        const fmha_uk_cache *c = parts->cache[f];
        if (c && c->scores && c->values) out->cache[f] = *c;
        else if (c) out->cache[f].load = c->load;
        if (c) {
            out->cache[f].scores_q8 = c->scores_q8;
            out->cache[f].values_int = c->values_int;
            out->cache[f].scores_bf16 = c->scores_bf16;
            out->cache[f].scores_bf16_qt = c->scores_bf16_qt;
            out->cache[f].values_bf16 = c->values_bf16;
            out->cache[f].q8_tiles = c->q8_tiles;
        }
        FMHA_FILL(out->cache[f], *spec->cache[f], load);
    }
    if (parts->thread) out->thread = *parts->thread;
    const fmha_uk_matrix *mx = parts->matrix;
    if (mx && mx->pack_q && mx->pack_k && mx->pack_v && mx->forward) {
        out->matrix = *mx;
        if (!(mx->pack_t && mx->backward && mx->nonfinite)) /* a partial backward counts as none */
            out->matrix.pack_t = NULL, out->matrix.backward = NULL, out->matrix.nonfinite = NULL;
        if (!(mx->pack_qt && mx->decode)) out->matrix.pack_qt = NULL, out->matrix.decode = NULL;
    }
}
