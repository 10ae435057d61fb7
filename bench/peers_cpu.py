#!/usr/bin/env python3
"""Time ggml's CPU rope beside libfusedrope's CPU backend and a copy, in one run.

  ggml         ggml_rope_ext (GGML_ROPE_TYPE_NEOX, theta 10000, no YaRN), one
               graph of that one op computed by ggml_graph_compute_with_ctx
               with --threads threads, from PyPI's prebuilt `libggml-python`
               package (its shared libraries loaded through ctypes; nothing
               of ggml is built or vendored here).  An sbhd tensor [S,B,H,D]
               is the ggml tensor ne = (D, H, S*B, 1) over the same bytes,
               token s*B+b at position s.  Out of place (ggml's output is a
               new tensor of its context).  fp16 and fp32: ggml has no bf16
               CPU rope.
  libfusedrope tools/fusedrope-bench --device cpu with the same shape, dtype
               and iteration count, under OMP_NUM_THREADS=--threads; it
               verifies itself against a float64 reference first and times a
               copy of the same bytes (memcpy split over its threads): the
               "copy" column, and the denominator of both "of copy" columns.

Rounds (--rounds) alternate the two (fusedrope-bench, then ggml), so that a
machine shared with other jobs slows both alike; every figure is the median
over rounds of each round's median of --iters calls.

VERIFIED before timed: ggml's output for up to 2048 tokens spread over the
tensor (all heads and channels) against a float64 reference (a' = a cos - b
sin, b' = b cos + a sin with angle = position * 10000^(-2i/D) in float64).
Passes when the relative L2 error is at most TOL and nothing is NaN.  TOL is 8
unit roundoffs of the dtype for fp16; for fp32 it is 2^-12, since ggml forms
each angle in float32 (by repeated multiplication of theta_scale) and so
cannot meet 8 float32 roundoffs at positions in the thousands (measured:
1.2e-5 over 512 positions, 9.6e-5 over 4096); the error is printed either way.

GB/s counts input + output bytes once, as fusedrope-bench does.

Exit status: 0 done (all verified), 1 a verification failed, 77 skipped
(libggml-python or numpy absent, or fusedrope-bench not found).

  python3 -m venv /work/venv-ggml && /work/venv-ggml/bin/pip install libggml-python numpy
  /work/venv-ggml/bin/python bench/peers_cpu.py --bench tools/fusedrope-bench \
      --shape 4096,1,32,128 --dtype fp16 --threads 2 --rounds 5
"""

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time

SKIP = 77


def parse_shape(s):
    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        v = ()
    if len(v) != 4 or min(v) <= 0 or v[3] % 2:
        raise argparse.ArgumentTypeError("expected S,B,H,D (positive, D even), got %r" % s)
    return v


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=parse_shape, action="append",
                    help="S,B,H,D (repeatable; default 4096,1,128,128 512,32,24,128 4096,1,32,128)")
    ap.add_argument("--dtype", choices=("fp16", "fp32"), action="append",
                    help="repeatable; default both")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "..", "tools", "fusedrope-bench"),
                    help="path of fusedrope-bench (default: ../tools/fusedrope-bench)")
    a = ap.parse_args()
    a.shape = a.shape or [(4096, 1, 128, 128), (512, 32, 24, 128), (4096, 1, 32, 128)]
    a.dtype = a.dtype or ["fp16", "fp32"]
    return a


def skip(msg):
    print("peers_cpu: skipped: " + msg)
    sys.exit(SKIP)


class Ggml:
    """The few ggml entry points used, from libggml-python's shared libraries."""

    TYPE = {"fp32": 0, "fp16": 1}
    I32 = 26
    ROPE_NEOX = 2

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                    ("no_alloc", ctypes.c_bool)]

    def __init__(self):
        try:
            import libggml  # the package ships lib64/ and include/, no Python API
        except ImportError:
            skip("the PyPI package libggml-python is not installed "
                 "(pip install libggml-python in a venv)")
        d = os.path.join(os.path.dirname(libggml.__file__), "lib64")
        try:
            base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
            cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            skip("libggml-python's libraries do not load: %s" % e)
        self.version = getattr(libggml, "__version__", None) or self._dist_version()
        P, I64, F, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        sig = [
            (base, "ggml_init", P, [Ggml.InitParams]),
            (base, "ggml_free", None, [P]),
            (base, "ggml_new_tensor_1d", P, [P, I, I64]),
            (base, "ggml_new_tensor_4d", P, [P, I, I64, I64, I64, I64]),
            (base, "ggml_get_data", P, [P]),
            (base, "ggml_nbytes", ctypes.c_size_t, [P]),
            (base, "ggml_tensor_overhead", ctypes.c_size_t, []),
            (base, "ggml_graph_overhead", ctypes.c_size_t, []),
            (base, "ggml_rope_ext", P, [P, P, P, P, I, I, I, F, F, F, F, F, F]),
            (base, "ggml_new_graph", P, [P]),
            (base, "ggml_build_forward_expand", None, [P, P]),
            (cpu, "ggml_cpu_init", None, []),
            (cpu, "ggml_graph_compute_with_ctx", I, [P, P, I]),
        ]
        for lib, name, res, args in sig:
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name[5:], f)
        self.cpu_init()

    @staticmethod
    def _dist_version():
        try:
            from importlib.metadata import version
            return version("libggml-python")
        except Exception:
            return "?"


class GgmlCase:
    """One context: x, positions, y = rope_ext(x) and its graph."""

    def __init__(self, g, np, shape, dtype, threads):
        S, B, H, D = shape
        es = 2 if dtype == "fp16" else 4
        n = S * B * H * D
        mem = 2 * n * es + 4 * S * B + 8 * g.tensor_overhead() + g.graph_overhead() + \
            4 * D * threads + (64 << 20)
        self.g, self.threads = g, threads
        self.ctx = g.init(Ggml.InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError("ggml_init(%d bytes)" % mem)
        self.x = g.new_tensor_4d(self.ctx, Ggml.TYPE[dtype], D, H, S * B, 1)
        pos = g.new_tensor_1d(self.ctx, Ggml.I32, S * B)
        np.ctypeslib.as_array((ctypes.c_int32 * (S * B)).from_address(g.get_data(pos)))[:] = \
            np.repeat(np.arange(S, dtype=np.int32), B)
        self.y = g.rope_ext(self.ctx, self.x, pos, None, D, Ggml.ROPE_NEOX, 0, 10000.0, 1.0,
                            0.0, 1.0, 32.0, 1.0)
        self.graph = g.new_graph(self.ctx)
        g.build_forward_expand(self.graph, self.y)
        ct = ctypes.c_uint16 if es == 2 else ctypes.c_float
        nt = np.float16 if es == 2 else np.float32
        self.xa = np.ctypeslib.as_array((ct * n).from_address(g.get_data(self.x))).view(nt)
        self.ya = np.ctypeslib.as_array((ct * n).from_address(g.get_data(self.y))).view(nt)
        self.xa.shape = self.ya.shape = (S * B, H, D)

    def run(self):
        st = self.g.graph_compute_with_ctx(self.ctx, self.graph, self.threads)
        if st != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx: status %d" % st)

    def free(self):
        self.g.free(self.ctx)


def verify(np, case, shape, dtype):
    """Relative L2 error of ggml's output on sampled tokens vs float64, and NaN count."""
    S, B, H, D = shape
    T = S * B
    toks = np.unique(np.linspace(0, T - 1, min(T, 2048)).astype(np.int64))
    x = case.xa[toks].astype(np.float64)
    y = case.ya[toks].astype(np.float64)
    p = (toks // B).astype(np.float64)
    inv = 10000.0 ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = p[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : D // 2], x[..., D // 2:]
    ref = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    bad = int(np.count_nonzero(~np.isfinite(y)))
    err = float(np.linalg.norm((y - ref).ravel()) / np.linalg.norm(ref.ravel()))
    return err, bad


def time_ggml(cases, iters, warmup):
    k = 0
    for _ in range(warmup):
        cases[k % len(cases)].run()
        k += 1
    t = []
    for _ in range(iters):
        c = cases[k % len(cases)]
        k += 1
        t0 = time.perf_counter()
        c.run()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


ROW = re.compile(r"^forward\s+\S+\s+(\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+([\d.]+)\s+\S+\s+\S+\s+(ok|FAIL)")


def run_bench(a, shape, dtype):
    cmd = [a.bench, "--device", "cpu", "--shape", ",".join(map(str, shape)), "--dtype", dtype,
           "--iters", str(a.iters), "--warmup", str(a.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in r.stdout.splitlines():
        m = ROW.match(line)
        if m:
            ms, copy_gbs, ok = float(m.group(4)), float(m.group(6)), m.group(8) == "ok"
            return ms, copy_gbs, ok and r.returncode == 0
    raise RuntimeError("fusedrope-bench printed no forward row:\n" + r.stdout)


def main():
    a = parse_args()
    try:
        import numpy as np
    except ImportError:
        skip("numpy is not installed")
    if not os.access(a.bench, os.X_OK):
        skip("fusedrope-bench not found at %s (--bench PATH)" % a.bench)
    g = Ggml()
    print("ggml from libggml-python %s; %d threads (ggml n_threads, OMP_NUM_THREADS); "
          "%d rounds x %d calls; forward, NeoX, sbhd, out of place" %
          (g.version, a.threads, a.rounds, a.iters))
    rng = np.random.default_rng(1)
    rows, failed = [], 0
    for shape in a.shape:
        S, B, H, D = shape
        for dtype in a.dtype:
            es = 2 if dtype == "fp16" else 4
            nbytes = 2 * S * B * H * D * es
            # ggml's sets rotate towards 64 MiB (in + out), at most 4 of them: a shape
            # under 16 MiB stays under 64 MiB, where fusedrope-bench rotates 64-256
            # MiB, so small shapes can favour ggml (found in cache), never the library
            nsets = max(1, min(4, -(-(64 << 20) // nbytes)))
            cases = [GgmlCase(g, np, shape, dtype, a.threads) for _ in range(nsets)]
            for c in cases:
                c.xa[...] = rng.uniform(-1, 1, size=c.xa.shape).astype(c.xa.dtype)
                c.ya.view(np.uint8)[...] = 0xff  # NaN: an unwritten element fails
            cases[0].run()
            err, nonfinite = verify(np, cases[0], shape, dtype)
            tol = 8 * 2.0 ** -11 if dtype == "fp16" else 2.0 ** -12
            ok_g = nonfinite == 0 and err <= tol
            lib_ms, copy, ggml_ms, ok_l = [], [], [], True
            for _ in range(a.rounds):
                ms, cg, ok = run_bench(a, shape, dtype)
                lib_ms.append(ms)
                copy.append(cg)
                ok_l = ok_l and ok
                ggml_ms.append(1e3 * time_ggml(cases, a.iters, a.warmup))
            for c in cases:
                c.free()
            lm, gm, cg = (statistics.median(v) for v in (lib_ms, ggml_ms, copy))
            lg, gg = nbytes / lm / 1e6, nbytes / gm / 1e6
            rows.append((",".join(map(str, shape)), dtype, lm, lg, lg / cg, gm, gg, gg / cg, cg,
                         err, "ok" if ok_l else "FAIL", "ok" if ok_g else "FAIL"))
            failed += (not ok_l) + (not ok_g)
            sys.stdout.flush()
    print("\n%-16s %-5s %10s %7s %7s %10s %7s %7s %8s %9s %5s %5s" %
          ("shape S,B,H,D", "dtype", "fr ms", "GB/s", "of copy", "ggml ms", "GB/s", "of copy",
           "copy GB/s", "ggml err", "fr", "ggml"))
    for r in rows:
        print("%-16s %-5s %10.3f %7.1f %7.3f %10.3f %7.1f %7.3f %8.1f %9.2e %5s %5s" % r)
    print("\nfr = libfusedrope (fusedrope-bench, verified by it); ggml err = relative L2 error "
          "against float64\non up to 2048 sampled tokens; medians over rounds of per-round "
          "medians.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
