/* replay.c - main() for a fuzz target in the normal (gcc) build: runs LLVMFuzzerTestOneInput
 * on every file named on the command line or found in a named directory (the seed corpus and
 * the saved crashes of tests/fuzz/regressions), so each stays a unit test without clang.
 * Each input is copied into a buffer of exactly its size, as libFuzzer does, so that an
 * over-read shows up under the ASan build of the suite. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "fuzz_common.h"

/* libFuzzer calls LLVMFuzzerInitialize when a target defines it; so do we. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) abort();
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) abort();
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir (not hidden), in name order so runs are reproducible.
 * Returns how many ran, or -1 on an unreadable file. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        if (!names) abort();
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = malloc(l);
        if (!names[n]) abort();
        snprintf(names[n++], l, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i]) != 0) ran = -1;
            else if (ran >= 0) ran++;
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int ran;
        if (stat(argv[i], &st) != 0) ran = 0; /* no saved crashes yet: no regressions folder */
        else if (S_ISDIR(st.st_mode)) ran = run_dir(argv[i]);
        else ran = run_file(argv[i]) == 0 ? 1 : -1;
        if (ran < 0) return 1;
        total += ran;
    }
    fprintf(stderr, "replay: %d inputs, no invariant broken\n", total);
    /* Nothing ran means the corpus went missing: that must not pass silently. */
    return total > 0 ? 0 : 1;
}
