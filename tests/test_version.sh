#!/bin/sh
# The version is AC_INIT's (configure.ac); configure writes it into the
# header and the pkg-config file, and the Python package's metadata repeats
# it in python/fusedrope/_version.py (pip builds the package from python/
# alone, without configure): all three must be AC_INIT's.
# Runs from the build directory; srcdir comes from the environment or $0.
srcdir=${srcdir:-`dirname "$0"`/..}
part() { sed -n "s/^#define FUSEDROPE_VERSION_$1 \([0-9][0-9]*\)\$/\1/p" include/fusedrope.h; }
want=`part MAJOR`.`part MINOR`.`part PATCH`
case $want in
    [0-9]*.[0-9]*.[0-9]*) ;;
    *) echo "FAIL: no FUSEDROPE_VERSION_MAJOR/MINOR/PATCH in include/fusedrope.h ($want)"; exit 1 ;;
esac
fail=0
pc=`sed -n 's/^Version: //p' pkgconfig/fusedrope.pc`
py=`sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$srcdir/python/fusedrope/_version.py"`
test "$pc" = "$want" || { echo "FAIL: pkgconfig/fusedrope.pc says Version: $pc, the header $want"; fail=1; }
test "$py" = "$want" || {
    echo "FAIL: python/fusedrope/_version.py says $py, the header (AC_INIT) $want"; fail=1; }
test $fail = 0 && echo "PASS: version $want in the header, fusedrope.pc and the Python package"
exit $fail
