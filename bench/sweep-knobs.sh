#!/usr/bin/env bash
# Device-side sweep of the CUDA launch knobs (kernels/cuda_apply.cu: FR_CUDA_*)
# over the issue-4 shapes, plus the kernel-only time of a decode step under
# Nsight Compute.  Run after bench/gpu-session.sh has built /tmp/build:
#   device run, carry [".devcarry"]: bash bench/gpu-session.sh check && bash bench/sweep-knobs.sh
set -uo pipefail
dest=${OUT:-/tmp/out}; mkdir -p "$dest"
cd /tmp/build/fusedrope-*/ || exit 1
log="$dest/sweep.txt"; : > "$log"
# The default takes the wide NeoX group per launch where an SM holds as many
# of its blocks (wide_shape in kernels/cuda_apply.cu); WIDE_PRELOAD=1 has the
# wide kernel issue its first group's loads before the token's position and
# table row (128 registers where 126: the same 16 warps an SM; bf16
# [4096,1,128,128] takes it); WIDE_RETILE=80 also takes the wide group where
# another count of tokens a block lets an SM hold two or more wide blocks
# and 80% of the narrow kernel's threads ([512,32,24,128]: 240-thread
# blocks, where the default runs the narrow group in 288-thread ones); with
# MAX_HPT=4 too, a thread's heads are one wide group, all its loads issued
# before its token's position (both seed shapes).
# Other knobs measured before (bench/RESULTS.md): U_NEOX_WIDE=0 (narrow
# everywhere), U_NEOX=4 (wide everywhere), the register caps (MAXNREG=80,
# 72, 64), WAVES=2, MAX_HPT=16; not yet U=4 (four heads a group in the
# interleaved lanes: the sweep that had U=4 ran it with U_NEOX=4, on NeoX
# shapes).  VARIANTS="-DFR_CUDA_U=4" runs it.
variants=${VARIANTS:-"default -DFR_CUDA_WIDE_PRELOAD=1 -DFR_CUDA_WIDE_RETILE=80,-DFR_CUDA_WIDE_PRELOAD=1 -DFR_CUDA_WIDE_RETILE=80,-DFR_CUDA_WIDE_PRELOAD=1,-DFR_CUDA_MAX_HPT=4"}
# a variant of several flags joins them with commas
for v in $variants; do
  flags=$(echo "$v" | tr , ' '); [ "$v" = default ] && flags=
  rm -f kernels/cuda_apply.o kernels/cuda_apply.lo libfusedrope_core.la tools/fusedrope-bench
  make -j16 NVCCFLAGS="$flags" libfusedrope_core.la tools/fusedrope-bench >/dev/null 2>&1 || { echo "$v: build failed" | tee -a "$log"; continue; }
  b=./tools/fusedrope-bench
  {
    echo "== $v"
    $b --iters 200 | grep -E '^(forward|backward)'
    $b --iters 200 --dtype fp16 --shape 512,32,24,128 | grep -E '^(forward|backward)'
    $b --iters 200 --shape 4096,1,128,128 --rot-dim 64 --inplace | grep -E '^(forward|backward)'
    $b --iters 200 --shape 4096,1,128,128 --style interleaved | grep -E '^(forward|backward)'
  } >> "$log" 2>&1
done
rm -f kernels/cuda_apply.o kernels/cuda_apply.lo libfusedrope_core.la tools/fusedrope-bench
make -j16 libfusedrope_core.la tools/fusedrope-bench >/dev/null 2>&1
if [ "${SWEEP_NCU:-1}" = 1 ]; then   # SWEEP_NCU=0: no decode timing under ncu
  echo "== decode under ncu (gpu__time_duration of each kernel)" >> "$log"
  timeout 180 ncu --metrics gpu__time_duration.sum --csv ./tools/fusedrope-bench \
    --shape 1,64,32,128 --qk 32,8 --iters 5 --warmup 1 > "$dest/ncu-decode.csv" 2>&1
  grep -E 'rope_kernel' "$dest/ncu-decode.csv" | awk -F'","' '{print $5, $(NF)}' | sort | uniq -c | head -20 >> "$log"
fi
cat "$log"
