"""Builds fusedrope._fusedrope against the installed libfusedrope.

The library is found through pkg-config (honouring PKG_CONFIG_PATH), or under
the prefix in FUSEDROPE_PREFIX (its lib/pkgconfig is searched first, and if it
has no .pc file, PREFIX/include and PREFIX/lib are used directly).  The static
archive is linked in whole when it is there, so the extension does not depend
on libfusedrope.so at run time; otherwise -lfusedrope (the shared library)
with an rpath to its directory.
"""
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup


def pkg_config(*args):
    env = dict(os.environ)
    prefix = os.environ.get("FUSEDROPE_PREFIX")
    if prefix:
        dirs = [os.path.join(prefix, d, "pkgconfig") for d in ("lib", "lib64", "share")]
        env["PKG_CONFIG_PATH"] = os.pathsep.join(dirs + [env.get("PKG_CONFIG_PATH", "")])
    try:
        out = subprocess.run(["pkg-config", *args, "fusedrope"], env=env, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def library_flags():
    cflags, libs = pkg_config("--cflags"), pkg_config("--libs")
    if cflags is None or libs is None:
        prefix = os.environ.get("FUSEDROPE_PREFIX")
        if not prefix:
            sys.exit("fusedrope: the C library was not found: `pkg-config --libs fusedrope` failed. "
                     "Install libfusedrope first, then set PKG_CONFIG_PATH to its lib/pkgconfig "
                     "or FUSEDROPE_PREFIX to its install prefix.")
        if not os.path.exists(os.path.join(prefix, "include", "fusedrope.h")):
            sys.exit(f"fusedrope: the C library was not found: FUSEDROPE_PREFIX is {prefix!r}, "
                     "which has no include/fusedrope.h (and pkg-config found no fusedrope.pc "
                     "under it). Set it to libfusedrope's install prefix.")
        libdir = next((os.path.join(prefix, d) for d in ("lib", "lib64")
                       if os.path.isdir(os.path.join(prefix, d))), os.path.join(prefix, "lib"))
        cflags = ["-I" + os.path.join(prefix, "include")]
        libs = ["-L" + libdir, "-lfusedrope", "-fopenmp", "-lm"]
    include_dirs = [f[2:] for f in cflags if f.startswith("-I")]
    other_cflags = [f for f in cflags if not f.startswith("-I")]
    libdirs = [f[2:] for f in libs if f.startswith("-L")]
    objects, link = [], []
    # what the extension is built from besides its source: a rebuild when any
    # is newer (pip builds in python/build/ and would otherwise reuse an
    # extension linked against an older library)
    depends = [os.path.join(d, "fusedrope.h") for d in include_dirs
               if os.path.exists(os.path.join(d, "fusedrope.h"))][:1]
    for f in libs:
        if f == "-lfusedrope":
            archive = next((os.path.join(d, "libfusedrope.a") for d in libdirs
                            if os.path.exists(os.path.join(d, "libfusedrope.a"))), None)
            if archive:
                objects.append(archive)
            else:
                link += [f] + ["-Wl,-rpath," + d for d in libdirs]
                depends += [os.path.join(d, "libfusedrope.so") for d in libdirs
                            if os.path.exists(os.path.join(d, "libfusedrope.so"))][:1]
        else:
            link.append(f)
    return include_dirs, other_cflags, objects, link, objects + depends


include_dirs, cflags, objects, link, depends = library_flags()

setup(
    ext_modules=[
        Extension(
            "fusedrope._fusedrope",
            sources=["src/_fusedrope.c"],
            include_dirs=include_dirs,
            extra_compile_args=cflags + ["-std=c11", "-Wall"],
            extra_objects=objects,
            extra_link_args=link,
            depends=depends,
        )
    ]
)
