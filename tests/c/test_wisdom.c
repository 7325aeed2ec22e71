/* test_wisdom.c: wisdom files and the planner that writes them (wisdom.h,
 * tuning.h's lookup order, tune.h).
 *   - the reader refuses bad files (bad JSON, a wrong version, a missing or
 *     mistyped key, an unknown field, a value out of range or off its
 *     multiple, a repeated key or entry, nesting past its depth) with a
 *     reason naming the place, and keeps nothing of them;
 *   - a good file gives each entry generic with its fields, the same every
 *     time and whatever the order of the entries;
 *   - the JSON reader under it (runtime/json.h) keeps to its caller's limits
 *     (bytes, depth, Python's NaN and Infinity) and unescapes to UTF-8;
 *   - in child processes of this program (the environment is read once):
 *     FMHA_WISDOM's entry for this CPU gives every table its tuning (source
 *     wisdom, describe's tuning_source=wisdom) before the per-user file,
 *     which comes before the compiled-in entries; FMHA_TUNING goes over
 *     them (source env); a refused file changes nothing, its reason is in
 *     fmha_tuning_status() and the library writes nothing on stderr;
 *   - the planner (fmha_tune on problems shrunk 16 times) writes a file the
 *     reader takes, keeps the other entries of the file it extends, replaces
 *     its own, and refuses a path holding something else (nothing written).
 * The variants' results (within tolerance, bitwise across thread counts)
 * are test_tuning's, under FMHA_TUNING=tile_mr=..,tile_nr=... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/cpu.h"
#include "test_util.h"
#include "api/tune.h"
#include "config/tuning.h"
#include "runtime/json.h"
#include "config/wisdom.h"

static char tmp_dir[256];

/* ---- the reader ---- */

static const char *const good =
    "{\"fmha_wisdom\": 1, \"note\": [1, 2.5e3, true, null, \"\\u00e9\\n\"],\n"
    " \"entries\": [\n"
    "  {\"vendor\": \"GenuineIntel\", \"family\": 6, \"model\": 167, \"isa\": \"amx\",\n"
    "   \"fields\": {\"block_kv\": 64, \"k_copy_bytes\": 262144, \"matrix_overlap\": 0},\n"
    "   \"rows\": [{\"row\": \"float32 fwd\", \"generic_ms\": 1.5, \"tuned_ms\": 1.25}]},\n"
    "  {\"vendor\": \"AuthenticAMD\", \"family\": 25, \"model\": 17, \"isa\": \"avx512\", \"fields\": {}}\n"
    " ]}\n";

static void test_reader_good(void) {
    fmha_wisdom w, w2;
    char err[256] = "";
    int rc = fmha_wisdom_parse(good, strlen(good), &w, err, sizeof err);
    if (!tu_check(rc == 0 && w.n_entries == 2, "a good file is read (%s)", err)) return;
    const fmha_wisdom_entry *e = fmha_wisdom_find(&w, "GenuineIntel", 6, 167, "amx");
    tu_check(e && e->tuning.block_kv == 64 && e->tuning.k_copy_bytes == 262144 && e->tuning.matrix_overlap == 0 &&
                 e->tuning.matrix_rescale_log2 == fmha_tuning_generic.matrix_rescale_log2 &&
                 e->tuning.dense_max_scores == fmha_tuning_generic.dense_max_scores &&
                 e->tuning.source == FMHA_TUNING_WISDOM,
             "the entry's fields over generic's");
    tu_check(e && e->text_len > 0 && w.text[e->text_at] == '{' && w.text[e->text_at + e->text_len - 1] == '}',
             "the entry's text span is the whole object");
    const fmha_wisdom_entry *a = fmha_wisdom_find(&w, "AuthenticAMD", 25, 17, "avx512");
    tu_check(a && a->tuning.block_kv == FMHA_TUNING_OF_TABLE && a->tuning.matrix_overlap == 1,
             "an entry without fields is generic");
    tu_check(!fmha_wisdom_find(&w, "GenuineIntel", 6, 167, "avx512") && !fmha_wisdom_find(&w, "GenuineIntel", 6, 143, "amx"),
             "no entry for another ISA or model");
    /* the same text twice, and its entries in the other order: the same choice */
    rc = fmha_wisdom_parse(good, strlen(good), &w2, err, sizeof err);
    const fmha_wisdom_entry *e2 = rc == 0 ? fmha_wisdom_find(&w2, "GenuineIntel", 6, 167, "amx") : NULL;
    tu_check(e && e2 && !memcmp(&e->tuning.tile_mr, &e2->tuning.tile_mr,
                                sizeof(fmha_tuning) - offsetof(fmha_tuning, tile_mr)),
             "reading a file twice chooses the same");
    fmha_wisdom_free(&w2);
    const char *swapped =
        "{\"entries\": [{\"fields\": {}, \"isa\": \"avx512\", \"model\": 17, \"family\": 25, \"vendor\": \"AuthenticAMD\"},"
        " {\"isa\": \"amx\", \"vendor\": \"GenuineIntel\", \"family\": 6, \"model\": 167,"
        "  \"fields\": {\"matrix_overlap\": 0, \"k_copy_bytes\": 262144, \"block_kv\": 64}}], \"fmha_wisdom\": 1}";
    rc = fmha_wisdom_parse(swapped, strlen(swapped), &w2, err, sizeof err);
    e2 = rc == 0 ? fmha_wisdom_find(&w2, "GenuineIntel", 6, 167, "amx") : NULL;
    tu_check(e && e2 && !memcmp(&e->tuning.tile_mr, &e2->tuning.tile_mr,
                                sizeof(fmha_tuning) - offsetof(fmha_tuning, tile_mr)),
             "the order of entries and keys does not change the choice");
    fmha_wisdom_free(&w2);
    fmha_wisdom_free(&w);
    tu_check(w.text == NULL && w.n_entries == 0, "free empties it");
}

#define ENTRY(fields) "{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"V\", \"family\": 1, \"model\": 2, \"isa\": \"x\", " fields "}]}"

static void test_reader_bad(void) {
    static const struct { const char *text, *reason; } bad[] = {
        {"", "ends where a value should be"},
        {"{", "key must be a string"},
        {"{\"fmha_wisdom\": 1, \"entries\": []", "expected ','"},
        {"{\"fmha_wisdom\": 1, \"entries\": []} x", "text after the value"},
        {"[1]", "one object"},
        {"{\"fmha_wisdom\": 2, \"entries\": []}", "\"fmha_wisdom\" must be 1"},
        {"{\"fmha_wisdom\": 1.0, \"entries\": []}", "\"fmha_wisdom\" must be 1"},
        {"{\"entries\": []}", "\"fmha_wisdom\" must be 1"},
        {"{\"fmha_wisdom\": 1}", "\"entries\" must be an array"},
        {"{\"fmha_wisdom\": 1, \"entries\": {}}", "\"entries\" must be an array"},
        {"{\"fmha_wisdom\": 1, \"fmha_wisdom\": 1, \"entries\": []}", "appears twice"},
        {"{\"fmha_wisdom\": 1, \"entries\": [3]}", "entries[0]: an entry must be an object"},
        {ENTRY("\"fields\": {\"block_kv\": 48}"), "block_kv must be an integer in 32..1024, a multiple of 32"},
        {ENTRY("\"fields\": {\"block_kv\": 2048}"), "block_kv must be"},
        {ENTRY("\"fields\": {\"block_kv\": 64.5}"), "block_kv must be"},
        {ENTRY("\"fields\": {\"block_kv\": 6.4e1}"), "block_kv must be"},
        {ENTRY("\"fields\": {\"block_kv\": \"64\"}"), "block_kv must be"},
        {ENTRY("\"fields\": {\"matrix_overlap\": 2}"), "matrix_overlap must be"},
        {ENTRY("\"fields\": {\"tile_nr\": 24}"), "tile_nr must be"},
        {ENTRY("\"fields\": {\"k_copy_bytes\": -1}"), "k_copy_bytes must be"},
        {ENTRY("\"fields\": {\"k_copy_bytes\": 1234567890123456789012}"), "k_copy_bytes must be"},
        {ENTRY("\"fields\": {\"blockkv\": 64}"), "unknown key \"blockkv\""},
        {ENTRY("\"fields\": {\"block_kv\": 64, \"block_kv\": 96}"), "appears twice"},
        {ENTRY("\"fields\": []"), "\"fields\" must be an object"},
        {ENTRY("\"fields\": {}, \"isa\": \"y\""), "appears twice"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"family\": 1, \"model\": 2, \"isa\": \"x\", \"fields\": {}}]}",
         "\"vendor\" must be a string"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"\", \"family\": 1, \"model\": 2, \"isa\": \"x\", "
         "\"fields\": {}}]}",
         "\"vendor\" must be a string"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"AVeryLongVendorName\", \"family\": 1, \"model\": 2, "
         "\"isa\": \"x\", \"fields\": {}}]}",
         "\"vendor\" must be a string"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"V\", \"family\": -1, \"model\": 2, \"isa\": \"x\", "
         "\"fields\": {}}]}",
         "\"family\" must be an integer"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"V\", \"family\": 1, \"isa\": \"x\", \"fields\": {}}]}",
         "\"model\" must be an integer"},
        {"{\"fmha_wisdom\": 1, \"entries\": [{\"vendor\": \"V\", \"family\": 1, \"model\": 2, \"isa\": 3, "
         "\"fields\": {}}]}",
         "\"isa\" must be a string"},
        {"{\"fmha_wisdom\": 1, \"entries\": [" "{\"vendor\": \"V\", \"family\": 1, \"model\": 2, \"isa\": \"x\", "
         "\"fields\": {}}, {\"vendor\": \"V\", \"family\": 1, \"model\": 2, \"isa\": \"x\", \"fields\": {}}]}",
         "entries[1] repeats the CPU and ISA of entries[0]"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": \"a\\qb\"}", "bad escape"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": \"\\u12g4\"}", "bad \\u escape"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": \"a\nb\"}", "control character"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": \"abc}", "without its closing quote"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": 01}", "expected ','"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": 1.}", "bad number"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": -}", "not a value"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": tru}", "not a value"},
        {"{\"fmha_wisdom\": 1, \"entries\": [], \"x\": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}", "nested too deep"},
        {"{\"fmha_wisdom\": 1 \"entries\": []}", "expected ','"},
        {"{\"fmha_wisdom\" 1}", "expected ':'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fmha_wisdom w = {(char *)"untouched", 7, NULL};
        char err[256] = "";
        const int rc = fmha_wisdom_parse(bad[i].text, strlen(bad[i].text), &w, err, sizeof err);
        tu_check(rc == -1 && strstr(err, bad[i].reason) && w.text == NULL && w.n_entries == 0 && w.entries == NULL,
                 "bad file %zu refused with \"%s\" and nothing kept: rc %d, \"%s\"", i, bad[i].reason, rc, err);
    }
    /* a text cut at every byte is refused (never read past its end) */
    size_t refused = 0, n = strlen(good);
    for (size_t cut = 0; cut + 1 < n; cut++) {
        fmha_wisdom w;
        char err[256] = "";
        char *text = malloc(cut ? cut : 1); /* exactly cut bytes: ASan sees a read past them */
        memcpy(text, good, cut);
        refused += fmha_wisdom_parse(text, cut, &w, err, sizeof err) == -1 && err[0] && w.n_entries == 0;
        fmha_wisdom_free(&w);
        free(text);
    }
    tu_check(refused == n - 1, "every prefix of a good file is refused (%zu of %zu)", refused, n - 1);
}

static void test_json_reader(void) {
    const fmha_json_limits strict = {64, 2, 0}, loose = {64, 3, 1};
    static const struct { const char *text; int strict, loose; } cases[] = {
        {"[[1]]", 0, 0}, {"[[[1]]]", -1, 0}, {"[NaN, Infinity, -Infinity]", -1, 0}, {"[-Inf]", -1, -1},
        {"\"abc\\", -1, -1}, {"[\"0123456789012345678901234567890123456789012345678901234567890\"]", -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fmha_json doc;
        char err[128] = "";
        const int a = fmha_json_read(cases[i].text, strlen(cases[i].text), &strict, &doc, err, sizeof err);
        fmha_json_free(&doc);
        const int b = fmha_json_read(cases[i].text, strlen(cases[i].text), &loose, &doc, err, sizeof err);
        fmha_json_free(&doc);
        tu_check(a == cases[i].strict && b == cases[i].loose, "json %zu: read %d and %d (%s)", i, a, b, err);
    }
    const char *text = "{\"k\": \"\\u00e9\\ud83d\\ude00\\ud800\\n\", \"n\": -12, \"k\": 1}";
    fmha_json doc;
    char err[128] = "", buf[32];
    int64_t n = 0;
    int repeated = 0;
    if (tu_check(fmha_json_read(text, strlen(text), &strict, &doc, err, sizeof err) == 0, "json read: %s", err)) {
        const int k = fmha_json_member(&doc, 0, "k", &repeated);
        tu_check(fmha_json_string(&doc, doc.nodes[0].child + 1, buf, sizeof buf) == 10 &&
                     !strcmp(buf, "\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd\n"),
                 "\\u escapes as UTF-8, a lone surrogate as U+FFFD");
        tu_check(fmha_json_string(&doc, doc.nodes[0].child + 1, buf, 5) == -1 && !strcmp(buf, "\xc3\xa9"),
                 "a string that does not fit: -1, a prefix");
        tu_check(k >= 0 && repeated && fmha_json_repeated_key(&doc, 0) == doc.nodes[0].child,
                 "a repeated key is found");
        tu_check(fmha_json_integer(&doc, fmha_json_member(&doc, 0, "n", &repeated), &n) == 0 && n == -12, "integer");
        fmha_json_free(&doc);
    }
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_load(void) {
    fmha_wisdom w;
    char err[256], path[320];
    snprintf(path, sizeof path, "%s/missing.json", tmp_dir);
    tu_check(fmha_wisdom_load(path, &w, err, sizeof err) == 1 && !strcmp(err, "not found") && w.n_entries == 0,
             "a missing file is not found: %s", err);
    tu_check(fmha_wisdom_load(tmp_dir, &w, err, sizeof err) == -1 && err[0] && w.n_entries == 0,
             "a directory is refused: %s", err);
    snprintf(path, sizeof path, "%s/good.json", tmp_dir);
    write_file(path, good);
    tu_check(fmha_wisdom_load(path, &w, err, sizeof err) == 0 && w.n_entries == 2, "a good file loads");
    fmha_wisdom_free(&w);
    char user[512], home[512];
    snprintf(home, sizeof home, "%s", getenv("HOME") ? getenv("HOME") : "");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    tu_check(fmha_wisdom_user_path(user, sizeof user) == 0 && !strcmp(user, "/x/cache/fmha/wisdom.json"),
             "the per-user file under XDG_CACHE_HOME: %s", user);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    tu_check(fmha_wisdom_user_path(user, sizeof user) == 0 && !strcmp(user, "/home/u/.cache/fmha/wisdom.json"),
             "else under HOME: %s", user);
    if (home[0]) setenv("HOME", home, 1);
    else unsetenv("HOME");
}

/* ---- the lookup, in child processes ---- */

/* A wisdom file with an entry for this CPU and every ISA of the registry,
 * each with `fields`. */
static void write_cpu_wisdom(const char *path, const char *fields) {
    char vendor[16] = {0};
    unsigned family, model;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "{\"fmha_wisdom\": 1, \"entries\": [\n");
    for (size_t i = 0; i < fmha_isa_count(); i++)
        fprintf(f, "%s{\"vendor\": \"%s\", \"family\": %u, \"model\": %u, \"isa\": \"%s\", \"fields\": {%s}}\n",
                i ? "," : "", vendor, family, model, fmha_isa_at(i)->name, fields);
    fprintf(f, "]}\n");
    fclose(f);
}

/* Runs this program as "child MODE" with FMHA_WISDOM, XDG_CACHE_HOME and
 * FMHA_TUNING set (NULL: unset); returns 1 when it passed and wrote
 * nothing on stderr. */
static int run_child(const char *mode, const char *wisdom, const char *cache, const char *tuning) {
    char err_path[320];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", tmp_dir);
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(err_path, "w", stderr)) _exit(3);
        const char *names[] = {"FMHA_WISDOM", "XDG_CACHE_HOME", "FMHA_TUNING"}, *values[] = {wisdom, cache, tuning};
        for (int i = 0; i < 3; i++) {
            if (values[i]) setenv(names[i], values[i], 1);
            else unsetenv(names[i]);
        }
        /* FMHA_TEST_EMULATOR (cross builds, CMakeLists.txt): "emulator
         * args...", which runs this program's own file */
        const char *emulator = getenv("FMHA_TEST_EMULATOR");
        if (emulator && *emulator) {
            static char words[1024], self[1024];
            char *argv[16];
            int argc = 0;
            ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
            if (n <= 0 || strlen(emulator) >= sizeof words) _exit(4);
            self[n] = '\0';
            strcpy(words, emulator);
            for (char *w = strtok(words, " "); w && argc < 12; w = strtok(NULL, " ")) argv[argc++] = w;
            argv[argc++] = self, argv[argc++] = "child", argv[argc++] = (char *)mode, argv[argc] = NULL;
            execv(argv[0], argv);
            _exit(4);
        }
        execl("/proc/self/exe", "test_wisdom", "child", mode, (char *)NULL);
        _exit(4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    FILE *f = fopen(err_path, "r");
    long err_bytes = -1;
    if (f) {
        fseek(f, 0, SEEK_END);
        err_bytes = ftell(f);
        fclose(f);
    }
    return tu_check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && err_bytes == 0,
                    "child %s (FMHA_WISDOM %s, XDG_CACHE_HOME %s, FMHA_TUNING %s): exit %d, %ld bytes on stderr", mode,
                    wisdom ? wisdom : "unset", cache ? cache : "unset", tuning ? tuning : "unset",
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, err_bytes);
}

/* The child's side: every table's tuning as `mode` says. */
static int child_main(const char *mode) {
    int64_t want_block = 0;
    fmha_tuning_source want_source = FMHA_TUNING_WISDOM;
    if (!strcmp(mode, "wisdom64")) want_block = 64;
    else if (!strcmp(mode, "wisdom96")) want_block = 96;
    else if (!strcmp(mode, "env256")) want_block = 256, want_source = FMHA_TUNING_ENV;
    const int refused = !strcmp(mode, "refused");
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        const fmha_tuning *t = isa->table->tuning;
        if (refused) {
            fmha_tuning base;
            char name[48];
            fmha_tuning_lookup(isa->name, &base, name, sizeof name);
            tu_check(t->source != FMHA_TUNING_WISDOM && t->source == base.source &&
                         (base.block_kv == FMHA_TUNING_OF_TABLE || t->block_kv == base.block_kv) &&
                         !strcmp(t->name, base.name),
                     "%s: a refused file changes nothing (tuning %s, source %s)", isa->name, t->name,
                     fmha_tuning_source_name(t->source));
        } else {
            tu_check(t->source == want_source && t->block_kv == want_block &&
                         isa->table->tile.block_kv == (size_t)want_block &&
                         !strcmp(t->name, want_source == FMHA_TUNING_ENV ? "wisdom+FMHA_TUNING" : "wisdom"),
                     "%s: tuning %s, source %s, block_kv %lld (want %lld)", isa->name, t->name,
                     fmha_tuning_source_name(t->source), (long long)t->block_kv, (long long)want_block);
        }
    }
    const char *status = fmha_tuning_status();
    if (refused)
        tu_check(strstr(status, "refused, nothing of it used: entries[0]: \"fields\": the unknown key \"blok_kv\"") !=
                     NULL,
                 "the status gives the reason: %s", status);
    else
        tu_check(strstr(status, ": read,") != NULL, "the status names the file read: %s", status);
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 2, 100, 100, 32, 32, FMHA_LAYOUT_BSHD);
    p.strategy = FMHA_STRATEGY_TILED;
    fmha_plan *plan;
    char line[1024], want[64];
    if (tu_check(fmha_plan_create(&p, &plan) == FMHA_OK, "plan")) {
        fmha_plan_describe(plan, line, sizeof line);
        snprintf(want, sizeof want, " tuning_source=%s",
                 fmha_tuning_source_name(fmha_cpu_kernels()->tuning->source));
        tu_check(strstr(line, want) && (refused || strstr(line, want_source == FMHA_TUNING_ENV ? " tuning_source=env"
                                                                                               : " tuning_source=wisdom")),
                 "describe: %s", line);
        fmha_plan_destroy(plan);
    }
    return tu_finish();
}

static void test_lookup(void) {
    char w64[320], w96_dir[320], w96[340], bad[320];
    snprintf(w64, sizeof w64, "%s/w64.json", tmp_dir);
    write_cpu_wisdom(w64, "\"block_kv\": 64");
    snprintf(w96_dir, sizeof w96_dir, "%s/cache", tmp_dir);
    mkdir(w96_dir, 0755);
    snprintf(w96, sizeof w96, "%s/fmha", w96_dir);
    mkdir(w96, 0755);
    snprintf(w96, sizeof w96, "%s/fmha/wisdom.json", w96_dir);
    write_cpu_wisdom(w96, "\"block_kv\": 96");
    snprintf(bad, sizeof bad, "%s/bad.json", tmp_dir);
    write_cpu_wisdom(bad, "\"blok_kv\": 64");
    char none[340];
    snprintf(none, sizeof none, "%s/none", tmp_dir);
    run_child("wisdom64", w64, none, NULL);      /* FMHA_WISDOM */
    run_child("wisdom96", NULL, w96_dir, NULL);  /* the per-user file */
    run_child("wisdom64", w64, w96_dir, NULL);   /* FMHA_WISDOM before the per-user file */
    run_child("env256", w64, none, "block_kv=256"); /* FMHA_TUNING over both */
    run_child("refused", bad, none, NULL);       /* a refused file: as if none */
}

/* ---- the planner ---- */

static void test_tune(void) {
    char path[320], err[256];
    snprintf(path, sizeof path, "%s/tuned.json", tmp_dir);
    /* another CPU's entry, kept */
    write_file(path, good);
    /* the budget bounds the fields measured, not what is written (emulated
     * runs: a few seconds) */
    fmha_status st = fmha_tune_shrunk(path, (double)tu_quick_pick(60, 5), NULL, NULL, 16);
    fmha_wisdom w;
    tu_check(st == FMHA_OK && fmha_wisdom_load(path, &w, err, sizeof err) == 0, "tuned into a file the reader takes: %s",
             st == FMHA_OK ? err : fmha_last_error_message());
    char vendor[16] = {0};
    unsigned family, model;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    const char *isa = fmha_cpu_kernels()->isa;
    tu_check(fmha_wisdom_find(&w, vendor, family, model, isa) != NULL, "an entry for this CPU and %s", isa);
    tu_check(fmha_wisdom_find(&w, "AuthenticAMD", 25, 17, "avx512") != NULL &&
                 (!strcmp(vendor, "GenuineIntel") && family == 6 && model == 167 && !strcmp(isa, "amx")
                      ? w.n_entries == 2
                      : w.n_entries == 3),
             "the file's other entries kept (%zu entries)", w.n_entries);
    tu_check(strstr(w.text, "\"generic_ms\"") && strstr(w.text, "\"tuned_ms\"") && strstr(w.text, "float32 fwd S=64"),
             "the rows measured are in the file");
    const size_t before = w.n_entries;
    fmha_wisdom_free(&w);
    st = fmha_tune_shrunk(path, 5.0, NULL, NULL, 16);
    tu_check(st == FMHA_OK && fmha_wisdom_load(path, &w, err, sizeof err) == 0 && w.n_entries == before,
             "tuning again replaces this CPU's entry (%zu entries)", w.n_entries);
    fmha_wisdom_free(&w);
    /* a path holding something else: refused, unchanged */
    snprintf(path, sizeof path, "%s/other.txt", tmp_dir);
    write_file(path, "not wisdom\n");
    st = fmha_tune_shrunk(path, 5.0, NULL, NULL, 16);
    FILE *f = fopen(path, "r");
    char text[64] = "";
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
    }
    tu_check(st == FMHA_ERR_BAD_FILE && !strcmp(text, "not wisdom\n") &&
                 strstr(fmha_last_error_message(), "nothing written"),
             "a file that is not wisdom is refused and left as it was: %s", fmha_last_error_message());
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "child")) return child_main(argv[2]);
    tu_seed();
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/fmha_test_wisdom_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    test_reader_good();
    test_reader_bad();
    test_json_reader();
    test_load();
    test_lookup();
    test_tune();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) printf("could not remove %s\n", tmp_dir);
    return tu_finish();
}
