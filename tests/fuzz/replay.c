/*
 * replay.c - runs the fuzz harness without libFuzzer, for `make check`:
 * every file of the seed corpus and of the regression inputs (or the files
 * and directories named on the command line), then FUZZ_REPLAY_RANDOM
 * (default 300; 30 under valgrind) pseudo-random inputs from a fixed seed.
 * Any finding aborts, so the test fails; FUZZ_REPLAY_SAVE=file keeps the
 * pseudo-random input being run in that file (the one that aborted).
 */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../run_seed.h"
#include "../under_valgrind.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The target's seed corpus and regression inputs under tests/fuzz/. */
#ifndef FUZZ_CORPUS
#define FUZZ_CORPUS "corpus"
#endif
#ifndef FUZZ_REGRESS
#define FUZZ_REGRESS "regress"
#endif

static unsigned long files;

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(1);
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    files++;
}

static void run_path(const char *path, int must_exist)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (must_exist) {
            perror(path);
            exit(1);
        }
        return;
    }
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        if (!d) {
            perror(path);
            exit(1);
        }
        while ((e = readdir(d)) != NULL) {
            char p[4096];
            if (e->d_name[0] == '.' || strncmp(e->d_name, "README", 6) == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            run_path(p, 1);
        }
        closedir(d);
    } else {
        run_file(path);
    }
}

int main(int argc, char **argv)
{
    const char *srcdir = getenv("srcdir");
    const char *rs = getenv("FUZZ_REPLAY_RANDOM");
    const char *save = getenv("FUZZ_REPLAY_SAVE");
    long random_inputs = rs ? atol(rs) : tu_under_valgrind() ? 30 : 300;
    /* the pseudo-random inputs' seed, as the libcheck programs take it (printed) */
    uint64_t seed, x;
    char p[4096];

    if (tu_run_seed("fuzz_replay", &seed) != 0)
        return 2;
    x = seed ? seed : 0x853c49e6748fea9bull; /* xorshift needs a nonzero state */

    printf("fuzz_replay: FUSEDROPE_TEST_SEED=%llu\n", (unsigned long long)seed);
    fflush(stdout);

    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            run_path(argv[i], 1);
    } else {
        snprintf(p, sizeof p, "%s/tests/fuzz/" FUZZ_CORPUS, srcdir ? srcdir : ".");
        run_path(p, 1);
        snprintf(p, sizeof p, "%s/tests/fuzz/" FUZZ_REGRESS, srcdir ? srcdir : ".");
        run_path(p, 0);
    }
    for (long i = 0; i < random_inputs; i++) {
        unsigned char buf[512];
        size_t n = 16 + (size_t)(i * 37 % 400);
        for (size_t j = 0; j < n; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            /* mostly small bytes: the harness reads them as "ordinary" choices */
            buf[j] = (unsigned char)(x % 7 == 0 ? x >> 24 : (x >> 24) % 200);
        }
        if (save) { /* the input being run, kept when it aborts */
            FILE *f = fopen(save, "wb");
            if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
                perror(save);
                exit(1);
            }
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("fuzz_replay (" FUZZ_CORPUS "): %lu files and %ld pseudo-random inputs, no finding\n", files,
           random_inputs);
    return 0;
}
