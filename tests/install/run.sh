#!/bin/sh
# tests/install/run.sh - `make installcheck` (and so `make distcheck`): builds
# and runs programs the way users of the INSTALLED library do, with nothing
# from the build tree but these sources.  The library is found through the
# install alone: PKG_CONFIG_PATH=$pkgconfigdir and CMAKE_PREFIX_PATH=$prefix.
#
#   downstream  tests/downstream.c linked with `pkg-config --cflags --libs`,
#               and with the archive named by path (README's static link)
#   a           a plugin (shared object) built from the installed static
#               archive, dlopen'ed by a program not linked with libfusedrope
#   b           the same plugin linked with the installed libfusedrope.so
#               (skipped when there is none: configure --enable-shared)
#   c           a strict C99 program and a strict C++11 program
#   d           CMake: find_package(fusedrope CONFIG) and pkg_check_modules,
#               plus the version file's rule (skipped without cmake)
#
# Each program checks a CPU forward against the float64 reference of
# consumer.h.  Environment (make passes it): CC CXX PKG_CONFIG CMAKE prefix
# libdir pkgconfigdir PACKAGE_VERSION top_srcdir.  The scratch directory is
# removed unless a step fails (or FUSEDROPE_KEEP_INSTALLCHECK=1).
set -u
# The CMake consumers' builds run make of their own: without the calling make's
# flags, whose jobserver this script does not hold ("jobserver unavailable").
unset MAKEFLAGS MFLAGS

: "${CC:=cc}" "${CXX:=c++}" "${PKG_CONFIG:=pkg-config}" "${CMAKE:=cmake}"
: "${prefix:?}" "${libdir:?}" "${pkgconfigdir:?}" "${PACKAGE_VERSION:?}" "${top_srcdir:?}"

here=`cd "$top_srcdir/tests/install" && pwd` || exit 1
top=`cd "$top_srcdir" && pwd` || exit 1
PKG_CONFIG_PATH="$pkgconfigdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
passed=0 failed=0 skipped=0 failures=

# One seed for every program, printed once (each program prints it too).
FUSEDROPE_TEST_SEED=${FUSEDROPE_TEST_SEED:-`date +%s`$$}
export FUSEDROPE_TEST_SEED
pass() { echo "PASS: $1"; passed=`expr $passed + 1`; }
fail() { echo "FAIL: $1"; failed=`expr $failed + 1`; failures="$failures $1"; }
skip() { echo "SKIP: $1"; skipped=`expr $skipped + 1`; }
# Prints and runs a command in $work; its output goes to stdout.
run() { echo "  + $*"; (cd "$work" && "$@"); }

if [ "`$PKG_CONFIG --variable=libdir fusedrope 2>/dev/null`" != "$libdir" ]; then
    echo "FAIL: pkg-config finds fusedrope in '`$PKG_CONFIG --variable=libdir fusedrope`', not $libdir"
    exit 1
fi
work=`mktemp -d "${TMPDIR:-/tmp}/fusedrope-installcheck.XXXXXX"` || exit 1
echo "installcheck: $prefix (libdir $libdir), scratch directory $work"
cflags=`$PKG_CONFIG --cflags fusedrope`
libs=`$PKG_CONFIG --libs fusedrope`
static_libs=`$PKG_CONFIG --static --libs fusedrope`
echo "  pkg-config --cflags: $cflags"
echo "  pkg-config --libs: $libs"
echo "  pkg-config --static --libs: $static_libs"
have_static=no have_shared=no
[ -f "$libdir/libfusedrope.a" ] && have_static=yes
[ -f "$libdir/libfusedrope.so" ] && have_shared=yes
echo "  installed: libfusedrope.a $have_static, libfusedrope.so $have_shared"
# Programs linked with -lfusedrope take the .so when there is one; the
# prefix is not on the loader's path, so they run with it added.
runenv="LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---------------------------------------------------------------- downstream
# (-lm: downstream.c's own use of libm, which only a static-only install's
# Libs happens to carry)
if run $CC -o downstream "$top/tests/downstream.c" $cflags $libs -lm &&
   run env "$runenv" ./downstream; then
    pass downstream
else
    fail downstream
fi

# The archive named by path, as README's "An executable" links it where a
# .so is installed beside it; run without the prefix on the loader's path,
# so a program that still needed libfusedrope.so would not start.
if [ $have_static = no ]; then
    skip "downstream-archive: no libfusedrope.a in $libdir"
elif run $CC -o downstream_archive "$top/tests/downstream.c" $cflags "$libdir/libfusedrope.a" \
         `echo "$static_libs" | sed 's/-lfusedrope//'` -lm &&
     run ./downstream_archive; then
    pass "downstream-archive: libfusedrope.a named, pkg-config --static's needs"
else
    fail "downstream-archive: libfusedrope.a named, pkg-config --static's needs"
fi

# The loader of plugins (a, b): not linked with libfusedrope.
if run $CC -o dlopen_main "$here/dlopen_main.c" -I"$here" -lm -ldl; then
    have_loader=yes
else
    have_loader=no
    fail "dlopen_main (the plugin loader) does not build"
fi

# A plugin's link checked before it is loaded: -z defs makes a link need
# missing from pkg-config's answer an error here rather than at dlopen.
plugin_flags="-shared -fPIC -Wl,-z,defs"

# ------------------------------------------------- a: plugin from the archive
if [ $have_static = no ]; then
    skip "a: no libfusedrope.a in $libdir (configured with --disable-static)"
elif [ $have_loader = yes ]; then
    # The archive goes inside the plugin, so its private needs are needed too
    # (--static).  With a .so installed as well -lfusedrope would pick it, so
    # then the archive is named.
    alibs=
    for f in $static_libs; do
        if [ "$f" = -lfusedrope ] && [ $have_shared = yes ]; then
            f="$libdir/libfusedrope.a"
        fi
        alibs="$alibs $f"
    done
    if run $CC $plugin_flags -o libwrap_static.so "$here/wrap.c" $cflags $alibs; then
        if command -v readelf >/dev/null 2>&1 &&
           readelf -d "$work/libwrap_static.so" | grep 'NEEDED.*libfusedrope'; then
            fail "a: libwrap_static.so needs libfusedrope.so"
        elif run ./dlopen_main ./libwrap_static.so static; then
            pass "a: plugin built from libfusedrope.a, dlopen'ed"
        else
            fail "a: plugin built from libfusedrope.a, dlopen'ed"
        fi
    else
        fail "a: plugin from libfusedrope.a does not link (is the archive PIC?)"
    fi
fi

# ---------------------------------------------------- b: plugin from the .so
if [ $have_shared = no ]; then
    skip "b: no libfusedrope.so in $libdir (configure --enable-shared installs one)"
elif [ $have_loader = yes ]; then
    # -rpath: the plugin finds the library where it was installed, without
    # LD_LIBRARY_PATH (dlopen_main runs without it).
    if run $CC $plugin_flags -o libwrap_shared.so "$here/wrap.c" $cflags $libs \
           -Wl,-rpath,"$libdir" &&
       run ./dlopen_main ./libwrap_shared.so shared; then
        pass "b: plugin linked with libfusedrope.so, dlopen'ed"
    else
        fail "b: plugin linked with libfusedrope.so, dlopen'ed"
    fi
fi

# ---------------------------------------------- c: strict C99 and C++11 users
if run $CC -std=c99 -pedantic -Wall -Wextra -Werror -o c99_main "$here/c99_main.c" \
       "$here/wrap.c" -I"$here" $cflags $libs -lm &&
   run env "$runenv" ./c99_main; then
    pass "c: C99 -pedantic -Werror"
else
    fail "c: C99 -pedantic -Werror"
fi
if run $CXX -std=c++11 -Wall -Wextra -pedantic -Werror -o cxx_main "$here/cxx_main.cc" \
       -I"$here" $cflags $libs &&
   run env "$runenv" ./cxx_main; then
    pass "c: C++11 -pedantic -Werror"
else
    fail "c: C++11 -pedantic -Werror"
fi

# ------------------------------------------------------------------ d: CMake
cmakedir="$libdir/cmake/fusedrope"
if ! command -v "$CMAKE" >/dev/null 2>&1; then
    skip "d: cmake not found (set CMAKE=/path/to/cmake): CMake consumers not tested"
else
    # The same compilers as the library (an archive built with gcc's OpenMP
    # wants gcc's runtime); CMake splits flags given in CC off the program.
    if run "$CMAKE" -DVERSION_FILE="$cmakedir/fusedrope-config-version.cmake" \
           -DVERSION="$PACKAGE_VERSION" -P "$here/cmake-version-check.cmake"; then
        pass "d: fusedrope-config-version.cmake's rule"
    else
        fail "d: fusedrope-config-version.cmake's rule"
    fi
    # cmake-config: the target is the .so when there is one, else the .a;
    # cmake-config-static: FUSEDROPE_USE_STATIC takes the .a (when both are
    # installed), whose link needs then come from the target alone.
    projects="cmake-config cmake-pkgconfig"
    [ $have_shared = yes ] && [ $have_static = yes ] && projects="$projects cmake-config-static"
    for build in $projects; do
        proj=$build type=STATIC opt=
        [ $have_shared = yes ] && type=SHARED
        case $build in
        cmake-config-static) proj=cmake-config type=STATIC opt=-DFUSEDROPE_USE_STATIC=ON ;;
        esac
        if run env CC="$CC" CXX="$CXX" "$CMAKE" -S "$here/$proj" -B "$build" \
               --no-warn-unused-cli -DCMAKE_PREFIX_PATH="$prefix" $opt \
               -DPKG_CONFIG_EXECUTABLE="`command -v $PKG_CONFIG`" \
               -DFR_TEST_SRC="$here" -DFR_EXPECT_DIR="$cmakedir" -DFR_EXPECT_TYPE=$type \
               -DFR_EXPECT_LIBDIR="$libdir" -DFR_EXPECT_VERSION="$PACKAGE_VERSION" &&
           run "$CMAKE" --build "$build" &&
           run env "$runenv" "./$build/consumer"; then
            pass "d: $build"
        else
            fail "d: $build"
        fi
    done
fi

echo "installcheck: $passed passed, $failed failed, $skipped skipped"
if [ $failed -ne 0 ]; then
    echo "installcheck: failed:$failures; scratch directory kept: $work"
    echo "installcheck: rerun with FUSEDROPE_TEST_SEED=$FUSEDROPE_TEST_SEED"
    exit 1
fi
if [ "${FUSEDROPE_KEEP_INSTALLCHECK:-0}" = 1 ]; then
    echo "installcheck: scratch directory kept: $work"
else
    rm -rf "$work"
fi
exit 0
