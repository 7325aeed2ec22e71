/* main.c: a minimal user of the installed fmha (tests/install): one small
 * forward pass checked against a direct softmax(Q K^T / sqrt(D)) V, and the
 * header's version against the library's. Built by the find_package and the
 * pkg-config consumers; prints one line and exits 0 when all is well. */
#include <fmha.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { S = 7, D = 8 };

int main(int argc, char **argv) {
    const char *name = argc > 0 && strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : "consumer";
    static float q[S * D], k[S * D], v[S * D], o[S * D];
    for (int i = 0; i < S * D; i++) {
        q[i] = (float)sin(0.37 * i);
        k[i] = (float)cos(0.23 * i);
        v[i] = (float)sin(0.11 * i + 1.0);
    }
    fmha_problem p;
    fmha_problem_init(&p, 1, 1, 1, S, S, D, D, FMHA_LAYOUT_BSHD);
    fmha_status st = fmha_forward(&p, q, k, v, o, NULL, NULL, 0);
    if (st != FMHA_OK) {
        fprintf(stderr, "%s: fmha_forward: %s\n", name, fmha_status_string(st));
        return 1;
    }
    double worst = 0.0;
    for (int i = 0; i < S; i++) {
        double s[S], mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < S; j++) {
            s[j] = 0.0;
            for (int d = 0; d < D; d++) s[j] += (double)q[i * D + d] * k[j * D + d];
            s[j] /= sqrt((double)D);
            if (s[j] > mx) mx = s[j];
        }
        for (int j = 0; j < S; j++) sum += (s[j] = exp(s[j] - mx));
        for (int d = 0; d < D; d++) {
            double ref = 0.0;
            for (int j = 0; j < S; j++) ref += s[j] / sum * v[j * D + d];
            double err = fabs(ref - o[i * D + d]);
            if (err > worst) worst = err;
        }
    }
    if (strcmp(fmha_version_string(), FMHA_VERSION_STRING) != 0 || worst > 1e-4) {
        fprintf(stderr, "%s: version %s (header %s), max error %g\n", name, fmha_version_string(),
                FMHA_VERSION_STRING, worst);
        return 1;
    }
    printf("%s: fmha %s (%s), max error %.1e\n", name, fmha_version_string(), fmha_isa_name(), worst);
    return 0;
}
