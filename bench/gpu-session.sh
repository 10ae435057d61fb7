#!/usr/bin/env bash
# One device call that builds, tests, sanitizes and measures (GPU.md):
#   ../shared/gpu/prepare-device-carry          # here: tarball + debs in .devcarry/
#   device run, carry [".devcarry"]: bash bench/gpu-session.sh [sections]
# Sections, run in the order given (default: check sanitize downstream bench
# peers); core is the short lineup (bf16 both shapes, decode with and without
# offsets, decode kernel time under Nsight Compute at the GPU's own clocks);
# graph times the decode step's calls replayed from one CUDA graph; sweep
# runs bench/sweep-knobs.sh; normwarp the norm forward's row kernel in
# several shapes (NORMWARP_VARIANTS) at several sizes; normbwd the norm
# backward's row kernel in several shapes (NORMBWD_VARIANTS), each
# variant built in its own tree in the background from the start (so run
# cuda or norm before them); normprof
# ncu's sections for the norm kernels (where their time goes); cpunorm
# the fused norm forward against plain on the host's CPUs;
# cuda builds and runs the CUDA test programs alone (no CPU suites: for a short
# lease; CUDA_TESTS names them, TEST_TIMEOUT limits each); norm times the
# fused RMSNorm + RoPE and its peers.  SAN_PROGRAMS (each prog or
# prog=tool,tool), SAN_TOOLS and SAN_TIMEOUT choose compute-sanitizer's
# programs, tools and each run's time limit, SAN_UNTIL the second of the
# session after which no sanitizer run starts (the sections after it still
# run); CHECK_TIMEOUT limits make check; PEER_TIMEOUT each
# peers script's.  Every summary line carries the seconds
# since the start, to plan the next lease.
# Logs go to /tmp/logs; $OUT gets summary.txt, bench.txt and logs.tgz (the
# device tool brings back at most 8 files).  Exit status: 0 when every
# requested section ran and nothing failed; 1 when a build, a test, a
# sanitizer run or a verification failed (summary.txt's last lines list
# them; a test that skips, rc 77, is listed apart and fails nothing); 2,
# with nothing run, when a section name is unknown.
set -uo pipefail
sections=${*:-check sanitize downstream bench peers}
# every section this script has (section_NAME below): an unknown name fails
# here, before any device time is spent
known_sections="check cuda sanitize downstream core graph sweep normwarp cpunorm normbwd normprof bench peers norm"
for sec in $sections; do
  case " $known_sections " in *" $sec "*) ;;
    *) mkdir -p "${OUT:-/tmp/out}"
       echo "gpu-session.sh: unknown section '$sec' (known: $known_sections); nothing run" |
         tee "${OUT:-/tmp/out}/summary.txt" >&2
       exit 2 ;; esac
done
out=/tmp/logs; rm -rf "$out"; mkdir -p "$out"
finish() {
  dest=${OUT:-/tmp/out}; mkdir -p "$dest"
  cp "$out/summary.txt" "$dest/" 2>/dev/null; cp "$out/bench.txt" "$dest/" 2>/dev/null
  tar -czf "$dest/logs.tgz" -C /tmp logs
}
trap finish EXIT
here=$(pwd)
sys=/tmp/sysroot; mkdir -p "$sys"
for deb in "$here"/.devcarry/debs/*.deb; do dpkg -x "$deb" "$sys"; done
lib="$sys/usr/lib/x86_64-linux-gnu"
export PATH="$PATH:$sys/usr/bin:/usr/local/cuda/bin"
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$sys"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libcheck's libsubunit
export CHECK_CFLAGS="-I$sys/usr/include" CHECK_LIBS="-L$lib -lcheck -lsubunit -lm -lrt -pthread"
summary="$out/summary.txt"; : > "$summary"
# The summary also goes straight to $OUT, so a run cut off at its limit still reports.
mkdir -p "${OUT:-/tmp/out}"
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$summary" "${OUT:-/tmp/out}/summary-live.txt"; }
# fail WHAT: a failed build, test, sanitizer run or verification, listed at
# the end and making the exit status 1; skipped WHAT: a test that skipped (77)
failures=() skips=()
fail() { failures+=("$*"); }
skipped() { skips+=("$*"); }
test_rc() {  # WHAT RC: a test program's exit status judged (77: skipped)
  case $2 in 0) ;; 77) skipped "$1" ;; *) fail "$1: rc $2" ;; esac
}
# bench_grep PATTERN COMMAND...: COMMAND's output lines that match PATTERN
# (and its FAIL lines); a non-zero exit of COMMAND is a FAIL line too, and
# kept in brc (set brc=0 before)
bench_grep() {
  local pat=$1 r; shift
  "$@" | grep -E "^FAIL|$pat"; r=${PIPESTATUS[0]}
  [ "$r" = 0 ] || { echo "FAIL: rc $r: $*"; brc=$r; }
  return 0
}
conclude() {  # the last lines of the summary, and the exit status
  local f
  for f in ${skips[@]+"${skips[@]}"}; do note "skipped: $f"; done
  if [ ${#failures[@]} -eq 0 ]; then note "done: nothing failed"; exit 0; fi
  note "FAILED (${#failures[@]}):"
  for f in "${failures[@]}"; do note "  $f"; done
  exit 1
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$out/device.txt"
nvcc --version | tail -1 >> "$out/device.txt"
note "device: $(head -1 "$out/device.txt")"

# REUSE_BUILD=1 on a machine still warm from a call of the same tarball: its
# build and install kept (a build took 46 s of device time on the 2026-11-28
# lease, 170 s on an earlier one).  "The same" is judged by content (each
# member's name, mode and bytes): two `make dist` of one tree differ in their
# bytes (timestamps) but not there.  Refused (noted, with the reason) where
# there is no install, the tarball's content differs, or bench/sweep-knobs.sh
# left the tree's cuda_apply built with other flags (its marker).
tar_content() {  # TARBALL: a hash of its members' names, modes and contents
  tar -xzf "$1" --to-command='printf "%s %s " "$TAR_MODE" "$TAR_FILENAME"; sha256sum' |
    LC_ALL=C sort | sha256sum | cut -d' ' -f1
}
reuse=
if [ "${REUSE_BUILD:-0}" = 1 ]; then
  if [ ! -x /tmp/inst/bin/fusedrope-bench ] || [ ! -f /tmp/build/built.tar.gz ]; then
    reuse="no earlier build on this machine (/tmp/inst, /tmp/build/built.tar.gz)"
  elif [ "$(tar_content "$here"/.devcarry/fusedrope-*.tar.gz)" != \
         "$(cat /tmp/build/built.content 2>/dev/null || tar_content /tmp/build/built.tar.gz)" ]; then
    reuse="the tarball's content differs from the one built"
  elif compgen -G '/tmp/build/fusedrope-*/.sweep-nvccflags' > /dev/null; then
    reuse="sweep-knobs.sh left the tree's cuda_apply other than the default ($(cat /tmp/build/fusedrope-*/.sweep-nvccflags))"
  else
    reuse=yes
  fi
fi
if [ "$reuse" = yes ]; then
  cd /tmp/build/fusedrope-*/ || exit 1
  src=$(pwd)
  note "build and install reused"
else
  [ -n "$reuse" ] && note "REUSE_BUILD=1 refused: $reuse; building"
  rm -rf /tmp/build && mkdir -p /tmp/build && tar -xzf "$here"/.devcarry/fusedrope-*.tar.gz -C /tmp/build
  cd /tmp/build/fusedrope-*/ || exit 1
  src=$(pwd)
  ./configure --with-cuda-arch=90 --prefix=/tmp/inst > "$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; fail "configure (configure.log)"; conclude; }
  make -j16 > "$out/make.log" 2>&1 && make install >> "$out/make.log" 2>&1 ||
    { tail -40 "$out/make.log"; fail "build or install (make.log)"; conclude; }
  cp "$here"/.devcarry/fusedrope-*.tar.gz /tmp/build/built.tar.gz
  tar_content /tmp/build/built.tar.gz > /tmp/build/built.content
  note "built and installed"
fi

# The sweep sections' variants (normwarp, normbwd), each in a tree of its own
# (the tarball unpacked again and configured alike) with its NVCCFLAGS,
# built niced in the background from here on, while the sections before the
# sweeps run (a rebuild in the one tree took 50-75 s of device time each);
# a section that times what the host's load could change waits for them
# first (quiet_host), which keeps each build's exit status (vrc).  Each tree
# is emptied first: a tree an earlier call on this machine built must not
# stand in for a build of this call that failed.
declare -A vdir vpid vrc
prebuild() {  # SECTION VARIANT KNOB... (VARIANT: A:B:... one value a knob)
  local sec=$1 v=$2 dir=/tmp/var/$1-${2//:/-} flags= vals i
  shift 2; local knobs=("$@")
  IFS=: read -r -a vals <<< "$v"
  for i in "${!vals[@]}"; do flags="$flags -D${knobs[$i]}=${vals[$i]}"; done
  vdir[$sec:$v]=$dir vrc[$sec:$v]=1
  rm -rf "$dir" && mkdir -p "$dir" &&
    tar -xzf "$here"/.devcarry/fusedrope-*.tar.gz -C "$dir" --strip-components=1 ||
    { echo "unpacking the tarball into $dir failed" > "$dir/build.log"; return; }
  ( cd "$dir" && nice ./configure --with-cuda-arch=90 > configure.log 2>&1 &&
      nice make -j4 NVCCFLAGS="$flags" libfusedrope_core.la tools/fusedrope-bench \
        tests/test_norm_gpu > build.log 2>&1 ) &
  vpid[$sec:$v]=$!
}
quiet_host() {
  local k n=0
  for k in "${!vpid[@]}"; do wait "${vpid[$k]}" 2> /dev/null; vrc[$k]=$?; n=$((n + 1)); done
  [ $n -gt 0 ] && note "quiet host: the $n variant builds done"
  vpid=()
}
normwarp_variants=${NORMWARP_VARIANTS:-1000000000:1:16:1:7:0:2 1000000000:1:16:1:7:7:2 1000000000:1:16:1:7:16:2:1}
normbwd_variants=${NORMBWD_VARIANTS:-1:1:6:36:1:0 1:1:0:36:1:0:1 1:1:5:36:1:0:0:3 1:1:5:36:1:0:1:3}
case " $sections " in *" normwarp "*)
  for v in $normwarp_variants; do
    prebuild normwarp $v FR_CUDA_NORM_WARP_ROWS FR_CUDA_NORM_WARP_RPW FR_CUDA_NORM_WARP_HEADS \
      FR_CUDA_NORM_WARP_AHEAD FR_CUDA_NORM_WARP_MINB FR_CUDA_NORM_WARP_GRID FR_CUDA_NORM_WARP_HALF \
      FR_CUDA_NORM_WARP_PREFETCH
  done ;;
esac
case " $sections " in *" normbwd "*)
  for v in $normbwd_variants; do
    prebuild normbwd $v FR_CUDA_NORM_BWD_HEADS FR_CUDA_NORM_BWD_AHEAD FR_CUDA_NORM_BWD_MINB \
      FR_CUDA_NORM_BWD_WAVE FR_CUDA_NORM_BWD_HALF FR_CUDA_NORM_BWD_PIPE FR_CUDA_NORM_BWD_PDL \
      FR_CUDA_NORM_BWD_PREFETCH
  done ;;
esac

section_check() {
  timeout ${CHECK_TIMEOUT:-900} make -j16 check > "$out/check.log" 2>&1; rc=$?
  cat tests/*.log > "$out/tests.log" 2>/dev/null
  note "make check: rc $rc; $(grep -E '^(PASS|FAIL|SKIP|ERROR):' "$out/check.log" | tr '\n' ' ')"
  grep -E '^[0-9]+%: Checks' tests/*.log | sed 's/^/  /' | tee -a "$summary"
  [ $rc = 0 ] || fail "make check: rc $rc (check.log)"
}

cuda_tests=${CUDA_TESTS:-tests/test_cuda tests/test_cache tests/test_norm_gpu tests/test_apply_gpu tests/test_axes_gpu}
section_cuda() {
  # a failed build skips this section only (note it: the later sections still run)
  local rc
  make -j16 $cuda_tests > "$out/cuda-build.log" 2>&1 ||
    { note "cuda tests' build failed: $(grep -m3 -E 'error' "$out/cuda-build.log")"
      fail "cuda tests' build (cuda-build.log)"; return 1; }
  for t in $cuda_tests; do
    timeout ${TEST_TIMEOUT:-300} ./$t > "$out/$(basename $t).log" 2>&1; rc=$?
    note "$t: rc $rc $(grep -E '^[0-9]+%: Checks' "$out/$(basename $t).log")"
    test_rc "$t" $rc
    grep -E ':[EF]:|differ|abort|Abort|fr_cuda|under capture' "$out/$(basename $t).log" | head -5 |
      while IFS= read -r l; do note "  $l"; done
  done
}

section_sanitize() {
  # an entry of SAN_PROGRAMS is a program, or program=tool,tool (its own tools)
  for entry in ${SAN_PROGRAMS:-tests/test_cuda}; do
    prog=${entry%%=*} tools=${SAN_TOOLS:-memcheck racecheck initcheck synccheck}
    [ "$entry" != "$prog" ] && tools=$(echo "${entry#*=}" | tr , ' ')
    [ -x $prog ] || make -j16 $prog > "$out/sanitize-build.log" 2>&1 ||
      { note "$prog: build failed (sanitize-build.log)"; fail "$prog: build for compute-sanitizer"; continue; }
    for tool in $tools; do
      if [ $(( $(date +%s) - t0 )) -ge ${SAN_UNTIL:-999999} ]; then
        note "compute-sanitizer $tool $prog: not run (past SAN_UNTIL=$SAN_UNTIL s)"; continue
      fi
      extra=; [ $tool = memcheck ] && extra="--leak-check full"
      log="$out/sanitize-$tool-$(basename $prog).log"
      timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool $tool $extra --error-exitcode 9 ./$prog \
        > "$log" 2>&1; rc=$?
      [ $rc = 0 ] || fail "compute-sanitizer $tool $prog: rc $rc"
      note "compute-sanitizer $tool $prog: rc $rc ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1); $(grep -cE '^========= +(Invalid|Uninitialized|Race|Barrier|Program hit)' "$log") error reports)"
    done
  done
}

downstream_run() (
  # a subshell: its pkg-config settings stay here, whatever section comes next;
  # exits 1 where either program failed to build or run (noted)
  local st=0 rc
  export PKG_CONFIG_PATH="/tmp/inst/lib/pkgconfig:$PKG_CONFIG_PATH"
  unset PKG_CONFIG_SYSROOT_DIR
  cc -o /tmp/downstream_gpu "$src/tests/downstream_gpu.c" -I/usr/local/cuda/include \
     $(pkg-config --cflags --libs fusedrope) > "$out/downstream.log" 2>&1 &&
    /tmp/downstream_gpu >> "$out/downstream.log" 2>&1; rc=$?
  note "downstream (pkg-config, GPU): rc $rc $(tail -1 "$out/downstream.log")"
  [ $rc = 0 ] || st=1
  cc -O2 -DRUNTIME_PARTS -I/usr/local/cuda/include -o /tmp/cache_time "$src/bench/cache-build-time.c" \
     $(pkg-config --cflags --libs fusedrope) &&
    /tmp/cache_time > "$out/cache-time.log" 2>&1; rc=$?
  note "$(cat "$out/cache-time.log" 2>/dev/null)"
  [ $rc = 0 ] || { note "cache-build-time: rc $rc"; st=1; }
  exit $st
)
section_downstream() {
  downstream_run || fail "downstream: downstream_gpu or cache-build-time (downstream.log, cache-time.log)"
}

section_core() {
  quiet_host
  b=/tmp/inst/bin/fusedrope-bench rc=0
  { $b --iters 200 || rc=$?
    $b --shape 1,64,32,128 --qk 32,8 --iters 1000 || rc=$?
    $b --shape 1,64,32,128 --qk 32,8 --iters 1000 --offsets || rc=$?
  } > "$out/bench.txt" 2> "$out/bench-progress.txt"
  note "bench (core): rc $rc (the last failing run's; 0: all verified)"
  [ $rc = 0 ] || fail "bench (core): rc $rc (bench.txt)"
  grep -E '^(forward|backward)' "$out/bench.txt" | awk '{print "  " $0}' | tee -a "$summary"
  # Kernel time alone (gpu__time_duration) at the GPU's own clocks: the decode
  # step with cold caches (ncu's default flush) and warm ones (its inputs just
  # written, as after the QKV projection), and the smallest call there is,
  # one token of one 16-channel head, for the fixed cost of any launch.
  for c in "all decode --shape 1,64,32,128 --qk 32,8 --offsets" \
           "none decode --shape 1,64,32,128 --qk 32,8 --offsets" \
           "none minimal --shape 1,1,1,16"; do
    set -- $c; cc=$1 name=$2; shift 2
    timeout 120 ncu --clock-control none --cache-control $cc --metrics gpu__time_duration.sum --csv \
      $b "$@" --iters 20 --warmup 2 > "$out/ncu-$name-$cc.csv" 2>&1; rc=$?
    [ $rc = 0 ] || fail "ncu $name --cache-control $cc: rc $rc (ncu-$name-$cc.csv)"
    note "kernel time, $name ($*), ncu --cache-control $cc: $(grep rope_kernel "$out/ncu-$name-$cc.csv" |
      awk -F'","' '{gsub(/[",]/, "", $NF); print $NF, $(NF-1)}' | sort -n |
      awk '{v[NR]=$1; u=$2} END {print "min", v[1], "median", v[int((NR+1)/2)], "max", v[NR], u, "over", NR, "kernels"}')"
  done
}

section_graph() {
  quiet_host
  # the decode step's 100 calls replayed from one CUDA graph, beside the same
  # calls issued one by one and the host's cost of one (fusedrope-bench --graph)
  b=/tmp/inst/bin/fusedrope-bench rc=0
  for opts in "" "--norm qwen3"; do
    $b --shape 1,64,32,128 --qk 32,8 --offsets --iters 200 --graph 100 $opts \
      >> "$out/bench-graph.txt" 2>> "$out/bench-progress.txt" || rc=$?
  done
  note "bench (graph): rc $rc"
  [ $rc = 0 ] || fail "bench (graph): rc $rc (bench-graph.txt)"
  grep -A4 -E '^op +shape +one call' "$out/bench-graph.txt" | grep -E '^(forward|backward|norm)' |
    awk '{print "  " $0}' | tee -a "$summary"
}

section_sweep() {
  quiet_host
  # bench/sweep-knobs.sh on this build (VARIANTS chooses the launch knobs)
  local rc
  bash "$here/bench/sweep-knobs.sh" > "$out/sweep.log" 2>&1; rc=$?
  note "sweep: rc $rc"
  [ $rc = 0 ] || fail "sweep: rc $rc (a variant's build or a bench run; sweep.txt)"
  grep -E '^(==|forward|backward|FAIL)|build failed' "${OUT:-/tmp/out}/sweep.txt" | tee -a "$summary"
}

# variant_tree SECTION VARIANT (after quiet_host): vt= the variant's tree
# (the variant "default": the main build's), its test_norm_gpu run and
# noted (VARIANT_TESTS=0: not run); fails (noted) where its build failed,
# judged by the build's exit status
variant_tree() {
  local rc
  vt=$src
  [ "$2" = default ] && return 0
  vt=${vdir[$1:$2]}
  if [ "${vrc[$1:$2]:-1}" != 0 ]; then
    note "$1 $2: build failed (rc ${vrc[$1:$2]:-1}): $(grep -h -m3 -E 'error' "$vt/build.log" "$vt/configure.log" 2>/dev/null)"
    fail "$1 $2: build ($vt/build.log, configure.log)"
    return 1
  fi
  [ "${VARIANT_TESTS:-1}" = 0 ] && return 0  # the bench still verifies each output
  ( cd "$vt" && timeout 120 ./tests/test_norm_gpu > test.log 2>&1 ); rc=$?
  note "$1 $2: test_norm_gpu rc $rc $(grep -E '^[0-9]+%: Checks' "$vt/test.log")"
  [ $rc = 0 ] || fail "$1 $2: test_norm_gpu rc $rc"
  return 0
}

section_normwarp() {
  # the norm forward's row kernels, each variant's build taking one
  # (FR_CUDA_NORM_WARP_ROWS 0: a thread per row; huge: rows over warps,
  # items of at most HEADS rows of a token, RPW of them at a time, the next
  # RPW rows' loads AHEAD or not, MINB blocks an SM asked of ptxas or 0,
  # GRID the grid's blocks an SM or 0: a warp an item, HALF 1 or 2 for
  # norm_forward_half (two rows a warp in 32-bit words, one or two pairs of
  # rows a step; RPW and AHEAD are norm_forward_warp's); PREFETCH 1: the
  # half-warp kernel's items' rows prefetched into L2; a value left off
  # keeps the default), test_norm_gpu
  # on each, then the same norm lines on the default build first and on
  # each (NORMWARP_VARIANTS chooses ROWS:RPW:HEADS:AHEAD:MINB:GRID:HALF:PREFETCH; by
  # default, around the default the 2026-11-29 lease chose (two pairs of
  # rows a step, items of 16 rows, 7 blocks asked: 72 registers, 24 bytes
  # spilled; 0.797 of a copy at 4096 tokens, again on the 2026-11-30 lease,
  # where items of 32 rows measured alike and two steps in flight lost):
  # a grid of a warp an item (GRID 0), of one wave (7 blocks an SM), and
  # the items' rows prefetched);
  # NORMWARP_TOKENS the sizes
  local brc r
  quiet_host
  for v in default $normwarp_variants; do
    variant_tree normwarp $v || continue
    b=$vt/tools/fusedrope-bench brc=0
    { echo "== FR_CUDA_NORM_WARP_ROWS:RPW:HEADS:AHEAD:MINB:GRID:HALF:PREFETCH=$v"
      for tokens in ${NORMWARP_TOKENS:-64 256 1024 4096 16384}; do
        bench_grep '^norm_fwd' $b --qk 32,8 --shape $tokens,1,1,128 --iters 100 --norm qwen3
      done
      for opts in "--norm gemma" "--norm once" "--norm qwen3 --style interleaved" \
                  "--norm qwen3 --dtype fp16"; do
        bench_grep '^norm_fwd' $b --qk 32,8 --shape 4096,1,1,128 --iters 100 $opts
      done
      $b --shape 1,64,32,128 --qk 32,8 --offsets --iters 200 --graph 100 --norm qwen3 |
        grep -E -A3 '^FAIL|^op +shape +one call' | grep -E '^(norm_fwd|FAIL)'; r=${PIPESTATUS[0]}
      [ "$r" = 0 ] || { echo "FAIL: rc $r: $b ... --graph 100 --norm qwen3"; brc=$r; }
    } >> "$out/bench-normwarp.txt" 2>> "$out/bench-progress.txt"
    [ $brc = 0 ] || fail "normwarp $v: a bench run failed (rc $brc; bench-normwarp.txt)"
  done
  grep -E '^(==|norm_fwd|FAIL)' "$out/bench-normwarp.txt" | tee -a "$summary"
}

section_cpunorm() {
  # the fused norm forward against plain RoPE on this host's CPUs (issue 13's
  # CPU target where every core shares the memory, as on a training node; the
  # build machine has 2): bf16, plain / once / gemma / qwen3 alternated,
  # CPUNORM_ROUNDS rounds at each of CPUNORM_THREADS; the bench's lines
  # (forward and backward, ms and of copy) go to bench-cpunorm.txt
  local b=/tmp/inst/bin/fusedrope-bench nt r n rc brc=0
  quiet_host
  note "host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) CPUs"
  for nt in ${CPUNORM_THREADS:-1 4 $(nproc)}; do
    for r in $(seq ${CPUNORM_ROUNDS:-3}); do
      for n in plain once gemma qwen3; do
        echo "== threads $nt round $r $n" >> "$out/bench-cpunorm.txt"
        OMP_NUM_THREADS=$nt timeout 120 $b --device cpu --qk 32,8 --shape 4096,1,1,128 \
          --layout bshd $([ $n = plain ] || echo --norm $n) --iters 30 2>&1 |
          grep -E '^(forward_qk|backward_qk|norm_fwd|norm_bwd|FAIL)' >> "$out/bench-cpunorm.txt"
        rc=${PIPESTATUS[0]}
        [ $rc = 0 ] || { echo "FAIL: rc $rc" >> "$out/bench-cpunorm.txt"; brc=$rc; }
      done
    done
    note "cpunorm $nt threads: forward ms (plain once gemma qwen3) by round: $(awk -v t="$nt" '
      /^== / { on = ($3 == t) } on && /^(forward_qk|norm_fwd)/ { printf "%s ", $6 }' "$out/bench-cpunorm.txt")"
  done
  [ $brc = 0 ] || fail "cpunorm: a bench run failed (rc $brc; bench-cpunorm.txt)"
}

section_normbwd() {
  # the norm backward's row kernel (norm_backward_heads) in each shape of
  # FR_CUDA_NORM_BWD_HEADS:AHEAD:MINB:WAVE:HALF:PIPE:PDL:PREFETCH (heads a warp takes at
  # a token where the call has more one-head units than WAVE warps an SM,
  # 0: always; tokens loaded or in flight in registers; blocks of 128 an SM
  # asked of ptxas; rows over half-warps, 1, or over warps, 0; over
  # half-warps, tokens in flight through shared memory, 0: in registers;
  # 1: the row kernel and the fold launched as programmatic dependents;
  # tokens ahead whose rows are prefetched into L2, 0: none; a
  # value left off keeps the default; ptxas's registers for bf16 NeoX 128
  # from x (nvcc 13.0, sm_90): the default 1:1:0:36:1:0 96 and 8 bytes
  # spilled (0.634 of a copy at 4096 tokens on the 2026-11-30 lease, where
  # two tokens held, 144, gave 0.440; 3 tokens through shared memory 0.517
  # on the lease before); by default 1:1:6:36:1:0, 80 registers and 176
  # bytes spilled; PDL; and prefetching 3 tokens ahead with MINB 5, 96
  # registers and 12 bytes spilled, with and without PDL),
  # each variant's build:
  # test_norm_gpu on each, then the backward lines (dw for q and k) at 1024,
  # 4096 and 16384 tokens and in fp16 and interleaved, on the default
  # build first and on each
  local brc
  quiet_host
  for v in default $normbwd_variants; do
    variant_tree normbwd $v || continue
    b=$vt/tools/fusedrope-bench brc=0
    { echo "== FR_CUDA_NORM_BWD_HEADS:AHEAD:MINB:WAVE:HALF:PIPE:PDL:PREFETCH=$v"
      for tokens in 1024 4096 16384; do
        bench_grep '^norm_bwd' $b --qk 32,8 --shape $tokens,1,1,128 --iters 100 --norm qwen3
      done
      for opts in "--dtype fp16" "--style interleaved"; do
        bench_grep '^norm_bwd' $b --qk 32,8 --shape 4096,1,1,128 --iters 100 --norm qwen3 $opts
      done
    } >> "$out/bench-normbwd.txt" 2>> "$out/bench-progress.txt"
    [ $brc = 0 ] || fail "normbwd $v: a bench run failed (rc $brc; bench-normbwd.txt)"
  done
  grep -E '^(==|norm_bwd|FAIL)' "$out/bench-normbwd.txt" | tee -a "$summary"
}

section_normprof() {
  # where the norm kernels' time goes: ncu's throughput, occupancy, launch and
  # warp-state sections (its rules name the top stall), and the compute
  # workload's pipe utilisation and the instruction mix (which pipe the
  # forward's 70% "SM throughput" is), for the kernels of one forward and one
  # backward each (norm_forward_warp, norm_backward_heads): 4096 tokens and
  # the decode step's 64
  b=/tmp/inst/bin/fusedrope-bench
  for c in "t4096 --qk 32,8 --shape 4096,1,1,128" "t64 --qk 32,8 --shape 64,1,1,128"; do
    set -- $c; name=$1; shift
    timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k regex:norm_ --launch-count 6 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section InstructionStats \
      $b "$@" --norm qwen3 --iters 1 --warmup 0 > "$out/ncu-norm-$name.txt" 2>&1; rc=$?
    note "ncu norm $name ($*): rc $rc"
    [ $rc = 0 ] || fail "ncu norm $name: rc $rc (ncu-norm-$name.txt)"
    grep -E '^  [a-z_:<>0-9, ()A-Za-z]+\(|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|stalled|Block Limit|Issue Slots Busy|Executed Ipc|pipeline|Pipe' \
      "$out/ncu-norm-$name.txt" | cut -c1-200 | head -120 | tee -a "$summary"
  done
}

section_bench() {
  quiet_host
  b=/tmp/inst/bin/fusedrope-bench rc=0
  { $b || rc=$?
    $b --dtype fp16 || rc=$?; $b --dtype fp32 || rc=$?
    $b --style interleaved || rc=$?
    $b --layout bshd || rc=$?; $b --layout thd || rc=$?
    $b --shape 4096,1,128,128 --rot-dim 64 --inplace || rc=$?
    $b --shape 1,64,32,128 --qk 32,8 --iters 1000 || rc=$?
    $b --shape 65536,2,32,128 --qk 32,8 --inplace --iters 50 || rc=$?
  } > "$out/bench.txt" 2> "$out/bench-progress.txt"
  note "bench: rc $rc (the last failing run's; 0: all verified)"
  [ $rc = 0 ] || fail "bench: rc $rc (bench.txt)"
  grep -E '^(forward|backward)' "$out/bench.txt" | awk '{print "  " $0}' | tee -a "$summary"
}

# python_binding: the Python binding (peers.py's and peers_norm.py's
# fusedrope-py row) built in place in $src/python against the install, once
# a call; the peers scripts run with PYTHONPATH="$src/python"
binding_rc=
python_binding() {
  [ -n "$binding_rc" ] && return "$binding_rc"
  ( unset PKG_CONFIG_SYSROOT_DIR; cd "$src/python" && FUSEDROPE_PREFIX=/tmp/inst PKG_CONFIG_PATH=/tmp/inst/lib/pkgconfig \
      timeout 120 python3 setup.py build_ext --inplace ) > "$out/python-build.log" 2>&1
  binding_rc=$?
  note "python binding build: rc $binding_rc"
  [ $binding_rc = 0 ] || fail "python binding build: rc $binding_rc (python-build.log)"
  return "$binding_rc"
}

section_peers() {
  local rc
  python_binding
  quiet_host   # the peers are timed from Python
  for shape in 4096,1,128,128 512,32,24,128; do
    PYTHONPATH="$src/python" PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-300} python3 "$src/bench/peers.py" \
      --bench /tmp/inst/bin/fusedrope-bench --shape $shape > "$out/peers-$shape.txt" 2>&1; rc=$?
    note "peers $shape: rc $rc"
    [ $rc = 0 ] || fail "peers $shape: rc $rc (peers-$shape.txt)"
    tail -8 "$out/peers-$shape.txt" | tee -a "$summary"
  done
}

section_norm() {
  b=/tmp/inst/bin/fusedrope-bench rc=0 progress="$out/bench-norm-progress.txt"
  $b --qk 32,8 --shape 4096,1,1,128 --iters 100 > "$out/bench-norm.txt" 2> "$progress" || rc=$?
  for kind in qwen3 gemma once; do
    $b --qk 32,8 --shape 4096,1,1,128 --norm $kind --iters 100 >> "$out/bench-norm.txt" 2>> "$progress" || rc=$?
  done
  # the other dtypes and style, and the generic kernels' shapes (partial rotary, float32)
  for opts in "--dtype fp16" "--style interleaved" "--dtype fp32" "--rot-dim 64" "--layout bshd"; do
    $b --qk 32,8 --shape 4096,1,1,128 --norm qwen3 --iters 100 $opts >> "$out/bench-norm.txt" 2>> "$progress" || rc=$?
  done
  note "bench (norm): rc $rc (the last failing run's; 0: all verified)"
  [ $rc = 0 ] || fail "bench (norm): rc $rc (bench-norm.txt)"
  grep -E '^(norm_|forward|backward)' "$out/bench-norm.txt" | awk '{print "  " $0}' | tee -a "$summary"
  python_binding   # for peers_norm's fusedrope-py row
  quiet_host   # the peers are timed a call at a time from Python
  for family in ${NORM_FAMILIES-qwen3 gemma3}; do   # NORM_FAMILIES="": none
    PYTHONPATH="$src/python" PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-300} python3 "$src/bench/peers_norm.py" \
      --bench /tmp/inst/bin/fusedrope-bench --family $family --shape 4096,1,32,8,128 \
      > "$out/peers-norm-$family.txt" 2>&1; rc=$?
    note "peers_norm $family: rc $rc"
    [ $rc = 0 ] || fail "peers_norm $family: rc $rc (peers-norm-$family.txt)"
    tail -8 "$out/peers-norm-$family.txt" | tee -a "$summary"
  done
}

# The sections in the order given (a short lease runs its most wanted first).
for sec in $sections; do
  if declare -F "section_$sec" > /dev/null; then "section_$sec"
  else note "section $sec: in known_sections but not defined"; fail "section $sec: not defined"; fi
done
conclude
