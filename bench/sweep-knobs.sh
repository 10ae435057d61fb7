#!/usr/bin/env bash
# Device-side sweep of the CUDA launch knobs (kernels/cuda_apply.cu: FR_CUDA_*)
# over the issue-4 shapes, plus the kernel-only time of a decode step under
# Nsight Compute.  Run after bench/gpu-session.sh has built /tmp/build:
#   device run, carry [".devcarry"]: bash bench/gpu-session.sh check && bash bench/sweep-knobs.sh
# Exits 1 where a variant's build or a bench run (its verification) failed.
set -uo pipefail
dest=${OUT:-/tmp/out}; mkdir -p "$dest"
cd /tmp/build/fusedrope-*/ || exit 1
log="$dest/sweep.txt"; : > "$log"
# The default takes the wide NeoX group per launch where an SM holds as many
# of its blocks (wide_pays in kernels/cuda_apply.cu), and four heads a group
# in the interleaved kernel (FR_CUDA_U_INTER 4; U_INTER=2 is the kernel before
# it: 0.876 of a copy in bf16 against 0.922 on the 2026-11-30 lease, which
# had it from a build with FR_CUDA_U=4; fp16 and fp32 not yet measured).
# Two knobs lost on that lease and were taken out (their code is in the
# history, at 222383c): the wide kernel's first group loaded before the
# token's position (WIDE_PRELOAD) and the wide group in another block where
# an SM holds fewer of its blocks (WIDE_RETILE).
# Other knobs measured before (bench/RESULTS.md): U_NEOX_WIDE=0 (narrow
# everywhere), U_NEOX=4 (wide everywhere), U=4 (every lane's group: the NeoX
# shape [512,32,24,128] 9 points slower), the register caps (MAXNREG=80, 72,
# 64), WAVES=2, MAX_HPT=16, MAX_HPT=4.
variants=${VARIANTS:-"default -DFR_CUDA_U_INTER=2"}
# The tree's cuda_apply is rebuilt only where a variant's flags differ from
# those it was last built with: .sweep-nvccflags holds them ("building ..."
# while a build runs, so one cut off is never taken for done; no file: the
# default, as gpu-session.sh built it), so the default, first, costs no
# compile, and gpu-session.sh's REUSE_BUILD refuses a tree left marked.
mark=.sweep-nvccflags
build() {  # FLAGS ("" = the default)
  if [ -x tools/fusedrope-bench ] && { { [ -z "$1" ] && [ ! -e $mark ]; } ||
       { [ -e $mark ] && [ "$(cat $mark)" = "$1" ]; }; }; then
    return 0
  fi
  echo "building $1" > $mark
  rm -f kernels/cuda_apply.o kernels/cuda_apply.lo libfusedrope_core.la tools/fusedrope-bench
  make -j16 NVCCFLAGS="$1" libfusedrope_core.la tools/fusedrope-bench >/dev/null 2>&1 || return 1
  if [ -z "$1" ]; then rm -f $mark; else echo "$1" > $mark; fi
}
# each run's forward/backward lines (and FAIL lines); a failing run noted, st=1
st=0
run() {
  local o r
  o=$($b "$@"); r=$?
  printf '%s\n' "$o" | grep -E '^(forward|backward|FAIL)'
  [ $r = 0 ] || { echo "FAIL: fusedrope-bench $*: rc $r"; st=1; }
}
# a variant of several flags joins them with commas
for v in $variants; do
  flags=$(echo "$v" | tr , ' '); [ "$v" = default ] && flags=
  build "$flags" || { echo "$v: build failed" | tee -a "$log"; st=1; continue; }
  b=./tools/fusedrope-bench
  {
    echo "== $v"
    run --iters 200
    run --iters 200 --dtype fp16 --shape 512,32,24,128
    run --iters 200 --shape 4096,1,128,128 --rot-dim 64 --inplace
    for dt in bf16 fp16 fp32; do
      run --iters 200 --shape 4096,1,128,128 --style interleaved --dtype $dt
    done
  } >> "$log" 2>&1
done
# the tree back to the default build (nothing to do where it is)
build "" || { echo "restoring the default build failed" | tee -a "$log"; st=1; }
if [ "${SWEEP_NCU:-1}" = 1 ]; then   # SWEEP_NCU=0: no decode timing under ncu
  echo "== decode under ncu (gpu__time_duration of each kernel)" >> "$log"
  timeout 180 ncu --metrics gpu__time_duration.sum --csv ./tools/fusedrope-bench \
    --shape 1,64,32,128 --qk 32,8 --iters 5 --warmup 1 > "$dest/ncu-decode.csv" 2>&1
  grep -E 'rope_kernel' "$dest/ncu-decode.csv" | awk -F'","' '{print $5, $(NF)}' | sort | uniq -c | head -20 >> "$log"
fi
cat "$log"
exit $st
