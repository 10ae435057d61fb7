#!/usr/bin/env python3
"""Time the peers libfusedrope is compared with, on the same GPU, in one run.

libfusedrope is a static C library, so it is not loaded here through ctypes:
its numbers come from the installed C benchmark, tools/fusedrope-bench, which
this script runs first (--bench PATH) with the same shapes, dtype, layout,
style, rot_dim and iteration count, in the same device session, before
timing the peers in this process:

  hf-eager     the Hugging Face formulation, written here from its math:
               y = x*cos + rotate_half(x)*sin  (neox), or GPT-J's
               rotate_every_two with cos/sin repeated per pair (interleaved);
               partial rotary: the first rot_dim channels rotated, the rest
               concatenated unchanged.  cos/sin are built once, outside the
               timed region, in float64 and cast to the input dtype, as the
               Hugging Face rotary module hands them to apply_rotary_pos_emb.
  hf-compile   the same function under torch.compile (default mode,
               dynamic=False, fullgraph=True).
  fusedrope-py libfusedrope through its Python package (python/, when it is
               installed; --no-binding skips it): fusedrope.forward/backward
               out of place into a preallocated tensor, with a default-type
               CUDA cache of S rows (theta 10000, as the tables here), so
               the difference from the libfusedrope row is the binding's
               per-call cost (DLPack export, argument checks).
  elementwise  no rope: torch.neg of the same bytes into a second buffer,
               PyTorch's own elementwise kernel, beside the copy (a
               cudaMemcpyAsync): what a kernel of these bytes reaches here.

Backward is the formulation's transpose written the same way (what autograd
runs for it, without the autograd engine): dx = dy*cos + rotate_half^T(dy*sin),
rotate_half^T(g) = cat(g2, -g1).

Every peer output is VERIFIED before it is timed: forward and backward, eager
and compiled, against a float64 reference computed pair by pair (a' = a c - b s,
b' = b c + a s, and the transpose), on the same random input.  A peer passes
when its relative L2 error is at most 8 unit roundoffs of the dtype and it has
no NaN.  Reported beside it: the share of elements within libfusedrope's
bound (DESIGN.md: ulp(ref) + 2^-22 (|a| + |b|)) and the worst error over that
bound.  The peers round cos/sin and every intermediate to the dtype, so they
do not meet that bound everywhere, and are not asked to.

Timing as in fusedrope-bench: warm-up, then N calls each between a pair of
CUDA events, the median; inputs rotated among enough copies that the copies
counted with an output each exceed 4x the L2 cache (the inputs alone 2x; each
peer's outputs come from PyTorch's allocator and are not rotated); GB/s counts the bytes that must move (input + output); "of copy"
is that rate over a device-to-device copy of the same bytes (tensor.copy_,
median of N with events) measured in this process.

Usage on the GPU machine (build the library with CUDA first):
  python3 bench/peers.py --bench BUILD/tools/fusedrope-bench
  python3 bench/peers.py --shape 4096,1,128,128 --dtype fp16 --iters 200
"""

import argparse
import math
import re
import shlex
import statistics
import subprocess
import sys

DTYPES = ("bf16", "fp16", "fp32")
# unit roundoff exponent (u = 2^-p), smallest normal exponent
DTYPE_INFO = {"bf16": (8, -126), "fp16": (11, -14), "fp32": (24, -126)}


def parse_shape(s):
    parts = s.split(",")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError("expected S,B,H,D (positive integers), got %r" % s)
    return tuple(int(p) for p in parts)


def parse_args():
    ap = argparse.ArgumentParser(
        description="Time the Hugging Face RoPE formulation (eager and torch.compile) "
        "against libfusedrope's fusedrope-bench on the same GPU, verifying every result.")
    ap.add_argument("--shape", type=parse_shape, action="append",
                    help="S,B,H,D (repeatable; default 4096,1,128,128 and 512,32,24,128)")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--layout", choices=("sbhd", "bshd"), default="sbhd")
    ap.add_argument("--style", choices=("neox", "interleaved"), default="neox")
    ap.add_argument("--rot-dim", type=int, default=0, help="rotated channels (default head_dim)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--no-binding", action="store_true",
                    help="skip the fusedrope Python package (python/)")
    ap.add_argument("--bench", metavar="PATH",
                    help="fusedrope-bench to run first with the same options (--device cuda)")
    ap.add_argument("--bench-args", default="", help="extra arguments for fusedrope-bench")
    a = ap.parse_args()
    if not a.shape:
        a.shape = [(4096, 1, 128, 128), (512, 32, 24, 128)]
    for s in a.shape:
        rot = a.rot_dim or s[3]
        if rot % 2 or rot < 2 or rot > s[3]:
            ap.error("rot_dim %d is not even and within 2..head_dim %d" % (rot, s[3]))
    if a.iters < 1 or a.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    return a


# ------------------------------------------------------------- fusedrope-bench

ROW = re.compile(r"^(forward|backward)(_qk)?\s")


def run_fusedrope_bench(a):
    """Runs the C benchmark; returns (rows, ok). Each row: dict op, shape, ms, gbs, frac, check."""
    cmd = [a.bench, "--device", "cuda", "--dtype", a.dtype, "--layout", a.layout,
           "--style", a.style, "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--seed", str(a.seed)]
    if a.rot_dim:
        cmd += ["--rot-dim", str(a.rot_dim)]
    for s in a.shape:
        cmd += ["--shape", ",".join(map(str, s))]
    cmd += shlex.split(a.bench_args)
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    rows = []
    for line in p.stdout.splitlines():
        if ROW.match(line):
            f = line.split()
            # op layout dtype shape MB ms GB/s copyGB/s of-copy max-ulp err/tol check
            if len(f) >= 12:
                rows.append(dict(op=f[0], shape=f[3], ms=float(f[5]), gbs=float(f[6]),
                                 copy=float(f[7]), frac=float(f[8]), tol=f[10], check=f[11]))
    return rows, p.returncode == 0


# ------------------------------------------------------------------ the peers

def build_peers(torch):
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def rotate_half_t(g):  # transpose of rotate_half
        h = g.shape[-1] // 2
        return torch.cat((g[..., h:], -g[..., :h]), dim=-1)

    def rotate_every_two(x):  # GPT-J: (x0, x1) -> (-x1, x0) per pair
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

    def rotate_every_two_t(g):
        return torch.stack((g[..., 1::2], -g[..., 0::2]), dim=-1).flatten(-2)

    def make(rot_fn):
        def fwd(x, cos, sin):
            r = cos.shape[-1]
            if r == x.shape[-1]:
                return x * cos + rot_fn(x) * sin
            xr = x[..., :r]
            return torch.cat((xr * cos + rot_fn(xr) * sin, x[..., r:]), dim=-1)
        return fwd

    return {"neox": (make(rotate_half), make(rotate_half_t)),
            "interleaved": (make(rotate_every_two), make(rotate_every_two_t))}


def build_binding(torch, S, rot, a, like):
    """('fusedrope-py', forward, backward) through the Python package, or None
    when it is not installed."""
    try:
        import fusedrope
    except ImportError:
        print("peers: the fusedrope Python package is not installed; no fusedrope-py row",
              file=sys.stderr)
        return None
    cache = fusedrope.Cache("default", rot_dim=rot, max_positions=S, theta=10000.0,
                            device="cuda")
    out = torch.empty_like(like)

    def fwd(x, cos, sin):
        return fusedrope.forward(cache, x, out=out, style=a.style, layout=a.layout)

    def bwd(x, cos, sin):
        return fusedrope.backward(cache, x, out=out, style=a.style, layout=a.layout)
    return ("fusedrope-py", fwd, bwd)


def cos_sin_tables(torch, S, rot, style, dev):
    """float64 [S, rot] tables laid out for the formulation, and [S, rot/2] for the reference."""
    half = rot // 2
    i = torch.arange(half, dtype=torch.float64, device=dev)
    inv = 10000.0 ** (-(2.0 * i) / rot)
    ang = torch.arange(S, dtype=torch.float64, device=dev)[:, None] * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    if style == "neox":
        cf, sf = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)
    else:
        cf, sf = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
    return c, s, cf, sf


def reference(torch, x, c, s, style, sign):
    """float64, pair by pair; sign +1 forward, -1 backward.  c, s broadcast to [..., rot/2].
    Returns the reference and, per element, |a| + |b| of its pair (0 past rot_dim)."""
    x = x.double()
    half = c.shape[-1]
    rot = 2 * half
    if style == "neox":
        ia, ib = slice(0, half), slice(half, rot)
    else:
        ia, ib = slice(0, rot, 2), slice(1, rot, 2)
    a, b = x[..., ia], x[..., ib]
    y = x.clone()
    y[..., ia] = a * c - sign * b * s
    y[..., ib] = b * c + sign * a * s
    pairsum = torch.zeros_like(x)
    pairsum[..., ia] = a.abs() + b.abs()
    pairsum[..., ib] = pairsum[..., ia]
    return y, pairsum


def check(torch, y, ref, pairsum, dtype):
    """(ok, rel_l2, fraction of elements within libfusedrope's bound, max err/bound).
    The bound is DESIGN.md's ulp(ref) + 2^-22 (|a| + |b|); the peers are not held to it
    (ok means relative L2 error <= 8 unit roundoffs and no NaN), it is reported to compare."""
    p, emin = DTYPE_INFO[dtype]
    y64 = y.double()
    if not torch.isfinite(y64).all():
        return False, float("inf"), 0.0, float("inf")
    err = (y64 - ref).abs()
    rel = (torch.linalg.vector_norm(err) / torch.linalg.vector_norm(ref)).item()
    _, e = torch.frexp(ref.abs())
    e = torch.where(ref == 0, torch.full_like(e, emin + 1), e)
    e = torch.clamp(e - 1, min=emin)
    tol = torch.ldexp(torch.ones_like(ref), (e - (p - 1)).to(torch.float64)) + pairsum * 2.0 ** -22
    ratio = err / tol
    within = (ratio <= 1).double().mean().item()
    return rel <= 8.0 * 2.0 ** -p, rel, within, ratio.max().item()


def time_events(torch, fn, inputs, iters, warmup):
    n = len(inputs)
    for i in range(warmup):
        fn(inputs[i % n])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for i in range(iters):
        x = inputs[(warmup + i) % n]
        ev[i][0].record()
        fn(x)
        ev[i][1].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) * 1e-3


def main():
    a = parse_args()
    results = []  # (op, shape, impl, ms, gbs, frac, check)
    ok_all = True

    if a.bench:
        rows, ok = run_fusedrope_bench(a)
        ok_all &= ok
        for r in rows:
            results.append((r["op"], r["shape"], "libfusedrope", r["ms"], r["gbs"], r["copy"],
                            r["frac"], r["check"] + " (err/tol %s)" % r["tol"]))
        print(flush=True)

    import torch
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device visible to PyTorch")
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 10**6) or 50 * 10**6
    print("peers: torch %s, %s, %d SMs, %.0f MB L2; %s %s %s, rot_dim %s, %d calls after %d "
          "warm-up (medians)" % (torch.__version__, props.name, props.multi_processor_count,
                                 l2 / 1e6, a.dtype, a.layout, a.style, a.rot_dim or "= head_dim",
                                 a.iters, a.warmup), flush=True)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    fwd, bwd = build_peers(torch)[a.style]
    impls = [("hf-eager", fwd, bwd)]
    if not a.no_compile:
        impls.append(("hf-compile", torch.compile(fwd, dynamic=False, fullgraph=True),
                      torch.compile(bwd, dynamic=False, fullgraph=True)))
    gen = torch.Generator(device=dev)

    for (S, B, H, D) in a.shape:
        rot = a.rot_dim or D
        shape_str = "%dx%dx%dx%d" % (S, B, H, D)
        gen.manual_seed(a.seed)
        dims = (S, B, H, D) if a.layout == "sbhd" else (B, S, H, D)
        x = (torch.rand(dims, generator=gen, device=dev, dtype=torch.float32) * 2 - 1).to(tdtype)
        c64, s64, cf64, sf64 = cos_sin_tables(torch, S, rot, a.style, dev)
        # broadcast shapes: sbhd [S,1,1,*]; bshd [1,S,1,*]
        view = (lambda t: t[:, None, None, :]) if a.layout == "sbhd" else \
               (lambda t: t[None, :, None, :])
        cos, sin = view(cf64).to(tdtype), view(sf64).to(tdtype)
        cr, sr = view(c64), view(s64)
        nbytes = 2 * x.numel() * x.element_size()
        nsets = max(1, min(4096, math.ceil(4 * l2 / nbytes)))
        inputs = [x] + [x.clone() for _ in range(nsets - 1)]
        binding = None if a.no_binding else build_binding(torch, S, rot, a, x)
        shape_impls = impls + ([binding] if binding else [])

        # copy bandwidth of the same bytes, in this process
        srcs = [torch.empty_like(x).copy_(x) for _ in range(nsets)]
        dsts = [torch.empty_like(x) for _ in range(nsets)]
        pairs = list(zip(dsts, srcs))
        copy_s = time_events(torch, lambda p: p[0].copy_(p[1]), pairs, a.iters, a.warmup)
        copy_gbs = nbytes / copy_s / 1e9
        # a plain elementwise kernel over the same bytes (PyTorch's torch.neg
        # into a second buffer): what a kernel reaches on this device beside
        # the copy (cudaMemcpyAsync), read as a kernel's practical ceiling
        ew_s = time_events(torch, lambda p: torch.neg(p[1], out=p[0]), pairs, a.iters, a.warmup)
        results.append(("elementwise", shape_str, "torch.neg", ew_s * 1e3, nbytes / ew_s / 1e9,
                        copy_gbs, copy_s / ew_s, "(reference: the same bytes, no rope)"))
        del srcs, dsts, pairs

        for opname, sign, pick in (("forward", 1.0, 1), ("backward", -1.0, 2)):
            ref, pairsum = reference(torch, x, cr, sr, a.style, sign)
            for impl in shape_impls:
                name, fn = impl[0], impl[pick]
                print("[peers] %s %s %s %s %s ..." % (name, opname, a.dtype, a.layout, shape_str),
                      file=sys.stderr, flush=True)
                y = fn(x, cos, sin)
                torch.cuda.synchronize()
                ok, rel, within, worst = check(torch, y, ref, pairsum, a.dtype)
                del y
                if not ok:
                    print("  %s %s: relative L2 error %.3g: FAIL" % (name, opname, rel),
                          file=sys.stderr)
                ok_all &= ok
                t = time_events(torch, lambda v: fn(v, cos, sin), inputs, a.iters, a.warmup)
                gbs = nbytes / t / 1e9
                results.append((opname, shape_str, name, t * 1e3, gbs, copy_gbs, gbs / copy_gbs,
                                ("ok" if ok else "FAIL") +
                                " (rel L2 %.2g; %.2f%% within bound, max err/tol %.3g)" %
                                (rel, 100 * within, worst)))
            del ref, pairsum
        del inputs, x, binding

    print("\n%-11s %-18s %-13s %10s %9s %9s %8s  %s" % ("op", "shape", "impl", "median ms", "GB/s",
                                                        "copy GB/s", "of copy", "check"))
    for op, shape, impl, ms, gbs, cgbs, frac, chk in sorted(results, key=lambda r: (r[1], r[0])):
        print("%-11s %-18s %-13s %10.4f %9.1f %9.1f %8.3f  %s" % (op, shape, impl, ms, gbs, cgbs,
                                                                 frac, chk))
    print("\n'of copy' is each program's own copy of the same bytes in the same run "
          "(fusedrope-bench: cudaMemcpyAsync; peers: tensor.copy_); 'elementwise' is "
          "torch.neg of the same bytes, a kernel's ceiling.")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
