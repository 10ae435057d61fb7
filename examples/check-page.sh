#!/bin/sh
# examples/check-page.sh - the programs printed in fusedrope-models(7) are
# the files in examples/, byte for byte (run by make check).
#
# In the page each program is one ".Bd -literal" block whose first line is
# the program's own first line, "/* NAME.c: ...".  The block is taken up to
# its ".Ed", the roff escapes a literal block needs are undone (a leading
# "\&", "\e" for a backslash), and the result is compared with examples/NAME.c.
# Every examples/*.c must appear in the page, and every block that names a
# program must have its file.

srcdir=${srcdir:-.}
page=$srcdir/man/fusedrope-models.7
dir=$srcdir/examples
scratch=./check-page.$$
trap 'rm -rf "$scratch"' 0
trap 'exit 1' 1 2 13 15
mkdir "$scratch" || exit 1

# One file per block, named after the program.
awk -v out="$scratch" '
    /^\.Bd -literal/ { inblock = 1; file = ""; next }
    /^\.Ed/ { inblock = 0; file = ""; next }
    inblock && file == "" {
        if (match($0, /^\/\* [a-z0-9_]+\.c: /)) {
            file = out "/" substr($0, 4, RLENGTH - 5)
            printf "" > file
        } else {
            inblock = 0
            next
        }
    }
    inblock && file != "" {
        line = $0
        sub(/^\\&/, "", line)
        gsub(/\\e/, "\\", line)
        print line >> file
    }
' "$page" || exit 1

status=0
for f in "$dir"/*.c; do
    name=`basename "$f"`
    if [ ! -f "$scratch/$name" ]; then
        echo "$name: not printed in man/fusedrope-models.7"; status=1
    elif ! cmp -s "$f" "$scratch/$name"; then
        echo "$name: the page's copy differs from examples/$name:"
        diff "$f" "$scratch/$name" | head -20
        status=1
    fi
done
for f in "$scratch"/*.c; do
    [ -f "$f" ] || continue
    name=`basename "$f"`
    [ -f "$dir/$name" ] || { echo "$name: printed in the page but not in examples/"; status=1; }
done
[ "$status" -eq 0 ] && echo "the page's programs equal examples/*.c"
exit $status
