#!/bin/sh
# The library's symbols, as a linker sees them (issue "Embeddable everywhere"):
#  - every global symbol defined in libfusedrope.a starts with fusedrope_
#    (ASan builds add __odr_asan.* indicators: compiler runtime, allowed)
#    (internal ones with the reserved fusedrope__, lib/symbols.h); C++
#    anonymous-namespace and compiler-runtime symbols aside;
#  - libfusedrope.so, where built, exports exactly lib/fusedrope.sym;
#  - lib/fusedrope.sym lists exactly the header's FUSEDROPE_API functions.
# Runs from the build directory; srcdir comes from the environment or $0.
srcdir=${srcdir:-`dirname "$0"`/..}
NM=${NM:-nm}
command -v "$NM" >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
fail=0
tmp=`mktemp -d` || exit 1
trap 'rm -rf "$tmp"' EXIT

sort -u "$srcdir/lib/fusedrope.sym" > "$tmp/sym"
tr '\n' ' ' < include/fusedrope.h | grep -o 'FUSEDROPE_API [^(]*(' |
    grep -o 'fusedrope_[a-z0-9_]*($' | tr -d '(' | sort -u > "$tmp/header"
if ! cmp -s "$tmp/sym" "$tmp/header"; then
    echo "FAIL: lib/fusedrope.sym and the header's FUSEDROPE_API functions differ (< sym, > header):"
    diff "$tmp/sym" "$tmp/header"
    fail=1
fi
test -s "$tmp/header" || { echo "FAIL: no FUSEDROPE_API function found in include/fusedrope.h"; fail=1; }

for a in .libs/libfusedrope.a .libs/libfusedrope_core.a; do
    test -f "$a" || continue
    "$NM" -g --defined-only "$a" | awk 'NF == 3 { print $3 }' | sort -u > "$tmp/all"
    grep -v -e '^fusedrope_' -e '_GLOBAL__N_' -e '^DW\.ref\.__gxx_personality_v0$' -e '^__odr_asan\.' \
        "$tmp/all" > "$tmp/stray"
    if test -s "$tmp/stray"; then
        echo "FAIL: global symbols of $a without the fusedrope_ prefix:"
        cat "$tmp/stray"
        fail=1
    fi
    grep '^fusedrope_[a-z0-9]' "$tmp/all" > "$tmp/public"
    if ! cmp -s "$tmp/public" "$tmp/sym"; then
        echo "FAIL: $a: public (fusedrope_, not fusedrope__) symbols differ from lib/fusedrope.sym (< archive, > sym):"
        diff "$tmp/public" "$tmp/sym"
        fail=1
    fi
    echo "ok: $a: `wc -l < "$tmp/all"` global symbols, `wc -l < "$tmp/public"` public"
done

so=`ls .libs/libfusedrope.so 2>/dev/null`
if test -n "$so"; then
    "$NM" -D --defined-only "$so" | awk 'NF == 3 { print $3 }' | sort -u > "$tmp/dyn"
    if ! cmp -s "$tmp/dyn" "$tmp/sym"; then
        echo "FAIL: $so exports other symbols than lib/fusedrope.sym (< exported, > sym):"
        diff "$tmp/dyn" "$tmp/sym"
        fail=1
    else
        echo "ok: $so exports exactly the `wc -l < "$tmp/sym"` functions of lib/fusedrope.sym"
    fi
else
    echo "(no shared library built: configure --enable-shared checks its exports)"
fi
exit $fail
