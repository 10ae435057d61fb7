#!/bin/sh
# man/lint.sh - check the manual pages with mandoc(1) (run by make check).
#
# Real pages must be silent under "mandoc -Tlint -W warning".  Link pages
# (one ".so man3/NAME.3" line) cannot be: mandoc always warns that .so is
# fragile, and resolves the path from the current directory.  So each link
# page is checked to point at a real page in this directory, and is then
# linted at -W error from a scratch directory where man3/ leads here, which
# proves that mandoc resolves it.  Exits 77 (skip) without mandoc.

command -v mandoc >/dev/null 2>&1 || { echo "mandoc not found: skipping"; exit 77; }

mandir=${srcdir:-.}/man
mandir=`cd "$mandir" && pwd` || exit 1
scratch=./man-lint.$$
trap 'rm -rf "$scratch"' 0
trap 'exit 1' 1 2 13 15
mkdir "$scratch" && ln -s "$mandir" "$scratch/man3" || exit 1

# mdoc macro names that are never English words
macro_words='Ns|Fa|Dv|Va|Fn|Fo|Fc|Xr|Sx|Pq|Nm|Cm|Ql|Dq|Sq|Bd|Ed|Bl|El'
status=0
pages=0
for page in "$mandir"/*.3 "$mandir"/*.1 "$mandir"/*.7; do
    [ -f "$page" ] || continue
    pages=`expr $pages + 1`
    name=`basename "$page"`
    first=`sed -n 1p "$page"`
    case $first in
    .so\ *)
        target=${first#.so }
        lines=`wc -l < "$page"`
        case $target in
        man3/*.3) ;;
        *) echo "$name: .so target must be man3/NAME.3: $target"; status=1; continue ;;
        esac
        if [ "$lines" -ne 1 ]; then
            echo "$name: a link page must hold one .so line only"; status=1
        elif [ ! -f "$mandir/${target#man3/}" ]; then
            echo "$name: .so target not found: $target"; status=1
        elif sed -n 1p "$mandir/${target#man3/}" | grep '^\.so' >/dev/null; then
            echo "$name: .so target is itself a link page: $target"; status=1
        else
            out=`cd "$scratch" && mandoc -Tlint -W error "man3/$name" 2>&1` || status=1
            [ -z "$out" ] || { echo "$out"; status=1; }
        fi
        ;;
    *)
        out=`mandoc -Tlint -W warning "$page" 2>&1` || status=1
        [ -z "$out" ] || { echo "$out"; status=1; }
        # of mandoc's style messages, the one about the pages' own text
        # (the others depend on the machine's manual database)
        out=`mandoc -Tlint -W style "$page" 2>&1 | grep 'input text line longer than 80 bytes'`
        [ -z "$out" ] || { echo "$out"; status=1; }
        # a macro in the middle of a text line is printed as a word, which
        # -Tlint does not flag: such words must not reach the rendered page
        out=`mandoc -Tmarkdown "$page" | grep -nwE "$macro_words"`
        [ -z "$out" ] || { echo "$name: mdoc macro printed as text:"; echo "$out"; status=1; }
        ;;
    esac
done

if [ "$pages" -eq 0 ]; then
    echo "no pages found in $mandir"
    exit 1
fi
[ "$status" -eq 0 ] && echo "$pages pages clean"
exit $status
