#!/bin/sh
# Smoke test of fusedrope-bench on the CPU: it must run, verify and exit 0.
# Runs from the build directory (make check's cwd), so VPATH builds work.
bench=./tools/fusedrope-bench
fail=0

run() {
    echo "+ $bench $*"
    "$bench" "$@" || { echo "FAILED (exit $?): $bench $*"; fail=1; }
}

run --device cpu --shape 64,2,4,128 --iters 2

# The other paths of the tool, small and quick.
run --device cpu --shape 48,3,4,64 --iters 2 --warmup 1 --working-set 8 --dtype fp16 --layout bshd --style interleaved
run --device cpu --shape 100,2,3,96 --iters 2 --warmup 1 --working-set 8 --dtype fp32 --layout thd --rot-dim 64
run --device cpu --shape 64,2,4,128 --iters 2 --warmup 1 --working-set 8 --inplace --rot-dim 32 --qk 8,2
run --device cpu --shape 1,16,4,64 --iters 2 --warmup 1 --working-set 8 --offsets --qk 4,2
# Position axes: Qwen2-VL's sections with a row of ids per axis.
run --device cpu --shape 40,2,3,128 --iters 2 --warmup 1 --working-set 8 --axes sections:16,24,24 --ids-rows
# The fused norm, forward and backward (dy its own tensor; in place, dx over
# dy; in place over few buffer sets, the timed forwards rewrite the inputs
# many times, and the backward's verification still needs their rstd).
run --device cpu --shape 32,2,1,128 --iters 2 --warmup 1 --working-set 8 --qk 4,2 --norm qwen3
run --device cpu --shape 40,2,1,128 --iters 12 --warmup 1 --working-set 1 --qk 3,1 --norm gemma --inplace --layout thd --rot-dim 64
# The norm on a cache with position axes (its reference takes a position per
# axis), with rows of ids and without.
run --device cpu --shape 16,2,2,32 --iters 1 --warmup 0 --working-set 1 --norm qwen3 --axes sections:4,6,6 --ids-rows
run --device cpu --shape 16,2,2,32 --iters 1 --warmup 0 --working-set 1 --norm once --axes interleaved:6,5,5 --layout thd

# Bad options: exit status 2.
"$bench" --dtype fp8 >/dev/null 2>&1
rc=$?
if [ $rc -ne 2 ]; then echo "FAILED: --dtype fp8 exited $rc, expected 2"; fail=1; fi
"$bench" --offsets --layout thd >/dev/null 2>&1
rc=$?
if [ $rc -ne 2 ]; then echo "FAILED: --offsets --layout thd exited $rc, expected 2"; fail=1; fi

"$bench" --axes sections:16,24,24 --ids-rows --offsets >/dev/null 2>&1
rc=$?
if [ $rc -ne 2 ]; then echo "FAILED: --ids-rows --offsets exited $rc, expected 2"; fail=1; fi
"$bench" --device cpu --shape 4,1,1,8 --axes sections:1,1,1 >/dev/null 2>&1
rc=$?
if [ $rc -ne 2 ]; then echo "FAILED: --axes sections:1,1,1 (sum 3, not 4) exited $rc, expected 2"; fail=1; fi
# a layout that does not fit a later shape is refused before any case runs
out=`"$bench" --device cpu --iters 1 --warmup 0 --shape 16,2,2,32 --shape 16,2,2,64 --axes sections:4,6,6 2>&1`
rc=$?
if [ $rc -ne 2 ] || echo "$out" | grep '\[1/' >/dev/null; then
    echo "FAILED: --axes unfit for the second shape exited $rc, expected 2 before any case:"; echo "$out"; fail=1
fi
"$bench" --seed 99999999999999999999 >/dev/null 2>&1
rc=$?
if [ $rc -ne 2 ]; then echo "FAILED: --seed past 64 bits exited $rc, expected 2"; fail=1; fi

exit $fail
