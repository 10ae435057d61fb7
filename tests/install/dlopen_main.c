/*
 * dlopen_main.c - loads a plugin built on libfusedrope (wrap.c) with dlopen,
 * the way Python or a plugin host does, and checks its forward against the
 * reference.  The program itself is not linked with libfusedrope.
 *
 * usage: dlopen_main PLUGIN static|shared
 *   static: the library must be inside the plugin (linked from the .a);
 *   shared: fusedrope_forward must come from an installed libfusedrope.so*.
 * dladdr tells which object fusedrope_forward was found in.
 *
 * Then what a plugin host does: closes the plugin and loads it again, many
 * times, each time after a call large enough for an OpenMP team (a closed
 * plugin took GNU libgomp with it, under the pool's live threads: the host
 * crashed), and forks after loading it once more (the new copy had not run
 * a team: the child's first team waited forever for the pool's threads).
 * Every call must give the first call's bytes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "consumer.h"

static const char *base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Past the size that starts a team (32768 elements, fusedrope_cache_create(3)). */
enum { BIG_S = 256, BIG_H = 4, BIG_D = 64 };
#define BIG_N ((size_t)BIG_S * BIG_H * BIG_D)
#define RELOADS 24

/* The plugin at path, RTLD_NOW (a link need missing from it fails here, not
 * mid-call), and its forward; NULL (said) and *plugin NULL where either
 * fails. */
static consumer_forward_fn load(const char *path, void **plugin)
{
    consumer_forward_fn forward = NULL;
    *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (*plugin)
        *(void **)&forward = dlsym(*plugin, "wrap_rope_forward");
    if (!forward) {
        printf("dlopen %s: %s\n", path, dlerror());
        if (*plugin)
            dlclose(*plugin);
        *plugin = NULL;
    }
    return forward;
}

/* 0 when y holds want's bytes after a forward of x. */
static int big_call(consumer_forward_fn forward, const float *x, float *y, const float *want)
{
    memset(y, 0xff, BIG_N * sizeof *y);
    if (forward(0, x, y, BIG_S, 1, BIG_H, BIG_D, BIG_D, CONSUMER_THETA) != 0)
        return 1;
    return want && memcmp(y, want, BIG_N * sizeof *y) != 0;
}

static int reload_and_fork(const char *path)
{
    float *x = (float *)malloc(BIG_N * sizeof *x), *y0 = (float *)malloc(BIG_N * sizeof *y0);
    float *y = (float *)malloc(BIG_N * sizeof *y);
    consumer_forward_fn forward;
    void *plugin = NULL;
    int status = 0, i, rc = 1;
    pid_t pid;
    if (!x || !y0 || !y)
        goto out;
    for (size_t j = 0; j < BIG_N; j++)
        x[j] = (float)((int)(j % 251) - 125) / 64.0f;
    for (i = 0; i < RELOADS; i++) {
        if (!(forward = load(path, &plugin)) || big_call(forward, x, i ? y : y0, i ? y0 : NULL)) {
            printf("%s: reload %d: the call failed or gave other bytes\n", base(path), i);
            goto out;
        }
        dlclose(plugin);
        plugin = NULL;
    }
    if (!(forward = load(path, &plugin)))
        goto out;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        alarm(60); /* a hang becomes SIGALRM */
        _exit(big_call(forward, x, y, y0) ? 1 : 0);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        printf("%s: the child forked after a reload %s\n", base(path),
               pid < 0 ? "could not start"
               : WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung" : "died of a signal")
                                     : "failed or gave other bytes");
        goto out;
    }
    printf("%s: %d closes and loads after calls of %zu elements, then a fork: the same bytes\n",
           base(path), RELOADS, BIG_N);
    rc = 0;
out:
    if (plugin)
        dlclose(plugin);
    free(x);
    free(y0);
    free(y);
    return rc;
}

int main(int argc, char **argv)
{
    void *plugin, *sym;
    consumer_forward_fn forward;
    const char *(*version)(void);
    Dl_info info;
    int static_lib;

    if (argc != 3 || (strcmp(argv[2], "static") && strcmp(argv[2], "shared"))) {
        fprintf(stderr, "usage: %s PLUGIN static|shared\n", argv[0]);
        return 2;
    }
    static_lib = !strcmp(argv[2], "static");
    /* a team for reload_and_fork's calls on a one-core machine too (the
     * OpenMP runtime reads it when the plugin brings it in) */
    setenv("OMP_NUM_THREADS", "2", 0);
    if (!(forward = load(argv[1], &plugin)))
        return 1;
    *(void **)&version = dlsym(plugin, "wrap_rope_version");
    sym = dlsym(plugin, "fusedrope_forward");
    if (!version || !sym || !dladdr(sym, &info) || !info.dli_fname) {
        printf("%s: a symbol is missing: %s\n", argv[1], dlerror());
        return 1;
    }
    printf("%s: libfusedrope %s, fusedrope_forward from %s\n", base(argv[1]), version(),
           info.dli_fname);
    if (static_lib ? strcmp(base(info.dli_fname), base(argv[1]))
                   : strncmp(base(info.dli_fname), "libfusedrope.so", 15)) {
        printf("%s: fusedrope_forward should come from %s\n", base(argv[1]),
               static_lib ? "the plugin itself" : "libfusedrope.so");
        return 1;
    }
    if (consumer_check(base(argv[1]), forward))
        return 1;
    dlclose(plugin); /* loaded again below */
    return reload_and_fork(argv[1]);
}
