"""Builds fusedrope._fusedrope against the installed libfusedrope.

The library is found through pkg-config (honouring PKG_CONFIG_PATH), or, when
FUSEDROPE_PREFIX is set, under that prefix only: its fusedrope.pc (lib,
lib64 or share/pkgconfig), and if it has none, PREFIX/include and PREFIX/lib
directly (OpenMP and libm added; a CUDA build's archive needs its .pc for the
CUDA runtime, and is refused without it).  The static archive is linked into
the extension when it is there (the members the extension uses), with what a
static link needs (pkg-config --static: OpenMP, libm, the CUDA runtime), so
the extension does not depend on libfusedrope.so at run time; otherwise
-lfusedrope (the shared library) with an rpath to its directory.  The
extension is always rebuilt.
"""
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def pkg_config(*args):
    env = dict(os.environ)
    prefix = os.environ.get("FUSEDROPE_PREFIX")
    if prefix:
        # the prefix's own .pc or none: another install's must not be taken
        dirs = [os.path.join(prefix, d, "pkgconfig") for d in ("lib", "lib64", "share")]
        dirs = [d for d in dirs if os.path.exists(os.path.join(d, "fusedrope.pc"))]
        if not dirs:
            return None
        env["PKG_CONFIG_PATH"] = os.pathsep.join(dirs + [env.get("PKG_CONFIG_PATH", "")])
    try:
        out = subprocess.run(["pkg-config", *args, "fusedrope"], env=env, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def archive_in(libdirs):
    return next((os.path.join(d, "libfusedrope.a") for d in libdirs
                 if os.path.exists(os.path.join(d, "libfusedrope.a"))), None)


def library_flags():
    cflags, libs = pkg_config("--cflags"), pkg_config("--libs")
    if libs is not None and archive_in([f[2:] for f in libs if f.startswith("-L")]):
        # the archive is linked: its dependencies are in Libs.private when
        # the library was also built shared (--enable-shared)
        libs = pkg_config("--static", "--libs") or libs
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
        archive = archive_in([libdir])
        if archive:
            with open(archive, "rb") as f:
                cuda = b"__cudaRegisterFatBinary" in f.read()
            if cuda:
                sys.exit(f"fusedrope: {archive} is a CUDA build, whose static link needs the "
                         "CUDA runtime that its fusedrope.pc names, and FUSEDROPE_PREFIX has "
                         "no lib/pkgconfig/fusedrope.pc: install libfusedrope with make "
                         "install (which writes it), or unset FUSEDROPE_PREFIX and point "
                         "PKG_CONFIG_PATH at the .pc of that install.")
        cflags = ["-I" + os.path.join(prefix, "include")]
        libs = ["-L" + libdir, "-lfusedrope", "-fopenmp", "-lm"]
    include_dirs = [f[2:] for f in cflags if f.startswith("-I")]
    other_cflags = [f for f in cflags if not f.startswith("-I")]
    libdirs = [f[2:] for f in libs if f.startswith("-L")]
    archive = archive_in(libdirs)
    objects, link = [], []
    for f in libs:
        if f == "-lfusedrope":
            if archive:
                objects.append(archive)
            else:
                link += [f] + ["-Wl,-rpath," + d for d in libdirs]
        else:
            link.append(f)
    return include_dirs, other_cflags, objects, link


class build_ext_always(build_ext):
    """Compiles and links the extension on every build: pip builds in
    python/build/, and an extension left there from another libfusedrope
    (another prefix, a build with or without CUDA or OpenMP) would be reused
    whenever it looked newer than the library's files."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True


include_dirs, cflags, objects, link = library_flags()

setup(
    cmdclass={"build_ext": build_ext_always},
    ext_modules=[
        Extension(
            "fusedrope._fusedrope",
            sources=["src/_fusedrope.c"],
            include_dirs=include_dirs,
            extra_compile_args=cflags + ["-std=c11", "-Wall"],
            extra_objects=objects,
            extra_link_args=link,
        )
    ]
)
