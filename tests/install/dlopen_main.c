/*
 * dlopen_main.c - loads a plugin built on libfusedrope (wrap.c) with dlopen,
 * the way Python or a plugin host does, and checks its forward against the
 * reference.  The program itself is not linked with libfusedrope.
 *
 * usage: dlopen_main PLUGIN static|shared
 *   static: the library must be inside the plugin (linked from the .a);
 *   shared: fusedrope_forward must come from an installed libfusedrope.so*.
 * dladdr tells which object fusedrope_forward was found in.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "consumer.h"

static const char *base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
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
    /* RTLD_NOW: a link need missing from the plugin fails here, not mid-call */
    plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        printf("dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    *(void **)&forward = dlsym(plugin, "wrap_rope_forward");
    *(void **)&version = dlsym(plugin, "wrap_rope_version");
    sym = dlsym(plugin, "fusedrope_forward");
    if (!forward || !version || !sym || !dladdr(sym, &info) || !info.dli_fname) {
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
    return consumer_check(base(argv[1]), forward) ? 1 : 0;
}
