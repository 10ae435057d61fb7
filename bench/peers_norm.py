#!/usr/bin/env python3
"""Time the fused per-head RMSNorm + RoPE against the peers a PyTorch user
would pick instead, in one run, on the GPU (default) or the CPU.

  torch-eager    the unfused model code, written here from transformers'
                 Qwen3RMSNorm (x.float(), pow(2).mean, rsqrt, weight *
                 n.to(dtype)) or Gemma3RMSNorm ((n * (1 + w.float())).to(dtype)),
                 then apply_rotary_pos_emb's formula (x*cos + rotate_half(x)*sin,
                 cos/sin in the dtype): q and k, forward; backward is autograd
                 of the same code (dq, dk and both weights' gradients).
  torch-compile  the same function under torch.compile (fullgraph=True).
  fusedrope-py   fusedrope.norm_forward_qk / norm_backward_qk through the
                 Python package (rstd saved; dweight for both weights), out
                 of place into preallocated tensors.
With --bench PATH, fusedrope-bench runs first with --norm and the same shape
(the C library without the binding's per-call cost).

Every output is VERIFIED before it is timed: each peer's forward against a
float64 evaluation of norm + RoPE (relative L2 error <= 8 unit roundoffs of
the dtype), its backward (dq, dk, dweights) against float64 autograd (relative
L2 <= 64 unit roundoffs: the peers round every intermediate to the dtype);
fusedrope-py's forward must also equal the unfused norm of the mode (the
peer's norm) followed by the library's rotation: >= 99% of the elements
identical and none more than 1 ulp (Gemma rounding; 3 for Llama's two
roundings) (of its pair's length) apart (float32:
within 4 ulps) (torch's own order of the sum of
squares can move rstd by its last bit; python/tests/test_norm.py has the
byte-for-byte comparison with the documented order).

Bytes that must move: forward q and k in and out (rstd and the weights are
counted too); backward the saved x, dy in, dx out, rstd. GB/s = those bytes /
median time; "of copy" = over a copy (tensor.copy_) that moves the same bytes
(reads half of them and writes the other half, as fusedrope-bench and
peers.py count a copy), timed the same way in this process.  Nothing
rotates among buffer sets here (the tensors, outputs and the copy's buffers
are each one allocation): at the default shape they are larger than an
H100's or H200's L2, but part of them may be found there.  (Before
2026-11-30 the copy moved twice the bytes it was credited with, so every
"of copy" and the copy's GB/s printed here were half the true figure and
twice the fraction: bench/RESULTS.md.)

  python3 bench/peers_norm.py [--device cuda|cpu] [--shape S,B,HQ,HK,D]
      [--family qwen3|gemma3] [--dtype bf16|fp16|fp32] [--iters N]
      [--no-compile] [--bench BUILD/tools/fusedrope-bench]
Exits 1 when a check fails, the fusedrope-bench run (--bench) included (its
nonzero exit: an output that did not verify, or a crash), as peers.py does;
77 when torch is missing or sees no CUDA device (1 if that bench run failed);
without the fusedrope package there is no fusedrope-py row.
"""
import argparse
import math
import shlex
import statistics
import subprocess
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--shape", default="4096,1,32,8,128",
                    help="S,B,HQ,HK,D (bshd q [B,S,HQ,D], k [B,S,HK,D]); default %(default)s")
    ap.add_argument("--family", choices=("qwen3", "gemma3"), default="qwen3")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--bench", metavar="PATH", help="fusedrope-bench to run first (--norm)")
    a = ap.parse_args()
    try:
        a.S, a.B, a.HQ, a.HK, a.D = (int(v) for v in a.shape.split(","))
    except ValueError:
        ap.error("--shape: expected S,B,HQ,HK,D")
    return a


def main():
    a = parse_args()
    if a.bench:
        cmd = [a.bench, "--device", a.device, "--dtype", a.dtype, "--layout", "bshd",
               "--qk", "%d,%d" % (a.HQ, a.HK), "--shape", "%d,%d,1,%d" % (a.S, a.B, a.D),
               "--norm", "qwen3" if a.family == "qwen3" else "gemma", "--iters", str(a.iters)]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        bench_rc = subprocess.run(cmd, check=False).returncode
        if bench_rc != 0:
            print("peers_norm.py: fusedrope-bench exited %d: FAIL" % bench_rc, flush=True)
    else:
        bench_rc = 0
    # where there is nothing to compare: 77, or 1 when the bench run failed
    skip = 77 if bench_rc == 0 else 1
    try:
        import torch
    except ImportError:
        print("peers_norm.py: PyTorch is not installed; nothing to compare", file=sys.stderr)
        sys.exit(skip)
    try:
        import fusedrope
    except ImportError:
        fusedrope = None
        print("peers_norm.py: the fusedrope package is not installed; no fusedrope-py row",
              file=sys.stderr)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("peers_norm.py: no CUDA device visible to PyTorch (use --device cpu)",
              file=sys.stderr)
        sys.exit(skip)
    dev = torch.device(a.device)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    p = {"bf16": 8, "fp16": 11, "fp32": 24}[a.dtype]  # unit roundoff 2^-p
    S, B, HQ, HK, D = a.S, a.B, a.HQ, a.HK, a.D
    eps, theta = 1e-6, 1000000.0
    gen = torch.Generator(device=dev).manual_seed(1)
    q = (torch.randn(B, S, HQ, D, generator=gen, device=dev) * 3).to(dt)
    k = (torch.randn(B, S, HK, D, generator=gen, device=dev)).to(dt)
    # Qwen3 keeps its norm weights in the model dtype; Gemma 3's are float32 parameters
    wdt = dt if a.family == "qwen3" else torch.float32
    qw = (torch.randn(D, generator=gen, device=dev) * 0.5).to(wdt)
    kw = (torch.randn(D, generator=gen, device=dev) * 0.5).to(wdt)
    dq = torch.randn(q.shape, generator=gen, device=dev).to(dt)
    dk = torch.randn(k.shape, generator=gen, device=dev).to(dt)

    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64, device=dev) / D)
    ang = torch.arange(S, dtype=torch.float64, device=dev)[:, None] * inv
    cos64 = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin64 = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    cos, sin = cos64.to(dt), sin64.to(dt)

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    def norm(x, w):
        n = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        if a.family == "qwen3":
            return w * n.to(x.dtype)
        return (n * (1.0 + w.float())).to(x.dtype)

    def unfused(q, k, qw, kw):
        qn, kn = norm(q, qw), norm(k, kw)
        return qn * cos + rotate_half(qn) * sin, kn * cos + rotate_half(kn) * sin

    def ref64(q, k, qw, kw):
        def one(x, w):
            x = x.double()
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            v = n * (w.double() if a.family == "qwen3" else 1.0 + w.double())
            return v * cos64 + rotate_half(v) * sin64
        return one(q, qw), one(k, kw)

    def rel(got, want):
        return (torch.linalg.vector_norm(got.double() - want.double()) /
                torch.linalg.vector_norm(want.double())).item()

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        for _ in range(a.warmup):
            fn()
        sync()
        t = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            fn()
            sync()
            t.append(time.perf_counter() - t0)
        return statistics.median(t)

    es = q.element_size()
    nq, nk = q.numel(), k.numel()
    rows = B * S * (HQ + HK)
    wbytes = 2 * D * qw.element_size()
    fwd_bytes = 2 * (nq + nk) * es + 4 * rows + wbytes
    bwd_bytes = 3 * (nq + nk) * es + 4 * rows + wbytes + 2 * D * 4

    def copy_time(moved):
        """median seconds of a copy that moves `moved` bytes: half read, half written"""
        src = torch.empty(moved // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        return timed(lambda: dst.copy_(src))
    copy_fwd, copy_bwd = copy_time(fwd_bytes), copy_time(bwd_bytes)

    # the float64 references
    leaves64 = [t.double().requires_grad_(True) for t in (q, k, qw, kw)]
    yq64, yk64 = ref64(*leaves64)
    ((yq64 * dq.double()).sum() + (yk64 * dk.double()).sum()).backward()
    grads64 = [t.grad for t in leaves64]
    yq64, yk64 = yq64.detach(), yk64.detach()

    impls = [("torch-eager", unfused)]
    if not a.no_compile:
        impls.append(("torch-compile", torch.compile(unfused, fullgraph=True)))
    results, ok_all = [], bench_rc == 0
    for name, fn in impls:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, qw, kw)]
        yq, yk = fn(*leaves)
        ((yq.float() * dq.float()).sum() + (yk.float() * dk.float()).sum()).backward()
        ef = max(rel(yq, yq64), rel(yk, yk64))
        eb = max(rel(g, g64) for g, g64 in zip((t.grad for t in leaves), grads64))
        ok = ef <= 8 * 2.0 ** -p and eb <= 64 * 2.0 ** -p
        ok_all &= ok
        tf = timed(lambda: fn(q, k, qw, kw))
        fl = [t.clone().requires_grad_(True) for t in (q, k, qw, kw)]

        def fwd_bwd():
            for t in fl:
                t.grad = None
            oq, ok_ = fn(*fl)
            torch.autograd.backward((oq, ok_), (dq, dk))
        tfb = timed(fwd_bwd)
        results.append((name, tf, max(tfb - tf, 0.0), ok, "rel L2 fwd %.2g bwd %.2g" % (ef, eb)))

    if fusedrope is not None:
        cache = fusedrope.Cache("default", rot_dim=D, max_positions=S, theta=theta,
                                device=a.device)
        weight, rounding = ("w", "llama") if a.family == "qwen3" else ("1+w", "gemma")
        oq, ok_ = torch.empty_like(q), torch.empty_like(k)
        rq = torch.empty(B, S, HQ, dtype=torch.float32, device=dev)
        rk = torch.empty(B, S, HK, dtype=torch.float32, device=dev)
        gq, gk = torch.empty_like(q), torch.empty_like(k)
        dqw = torch.empty(D, dtype=torch.float32, device=dev)
        dkw = torch.empty(D, dtype=torch.float32, device=dev)

        def ffwd():
            fusedrope.norm_forward_qk(cache, q, k, qw, kw, weight=weight, rounding=rounding,
                                      eps=eps, rstd=(rq, rk), layout="bshd", out=(oq, ok_))

        def fbwd():
            fusedrope.norm_backward_qk(cache, q, dq, k, dk, qw, kw, rstd=(rq, rk),
                                       weight=weight, rounding=rounding, eps=eps,
                                       dweight=(dqw, dkw), layout="bshd", out=(gq, gk))
        ffwd()
        fbwd()
        sync()
        # the unfused norm of the mode, then the library's rotation: the same bytes
        with torch.no_grad():
            uq, uk = norm(q, qw).contiguous(), norm(k, kw).contiguous()
        fusedrope.forward_qk(cache, uq, uk, layout="bshd")
        sync()
        # torch sums the squares in its own order, so rstd may differ in its last
        # bit and an element round the other way, rarely: at most 1 ulp where the
        # mode rounds once before the rotation (Gemma), 3 where it rounds n and
        # then n * w (Llama: a flip of n moves n * w by up to |w| ulps, then its
        # own rounding), the allowance of ref_norm_y_tolerance (tests/ref.h)
        same_frac = min((oq == uq).double().mean().item(), (ok_ == uk).double().mean().item())
        # in ulps of the pair's length (the rotation moves a 1-ulp change of
        # its input into either channel of the pair)
        def ulps(o, u):
            u = u.double()
            m = (u[..., :D // 2] ** 2 + u[..., D // 2:] ** 2).sqrt().repeat(1, 1, 1, 2)
            return ((o.double() - u).abs() / (m * 2.0 ** (1 - p) + 1e-300)).max().item()
        ulp_max = max(ulps(oq, uq), ulps(ok_, uk))
        # float32 keeps every bit of that difference (no rounding to a 16-bit
        # type hides it): a few ulps of the pair's length
        flips = 3.0 if rounding == "llama" else 1.0
        same = ulp_max <= 4.0 if a.dtype == "fp32" else same_frac >= 0.99 and ulp_max <= flips
        ef = max(rel(oq, yq64), rel(ok_, yk64))
        eb = max(rel(g, g64) for g, g64 in zip((gq, gk, dqw, dkw), grads64))
        ok = same and ef <= 8 * 2.0 ** -p and eb <= 64 * 2.0 ** -p
        ok_all &= ok
        results.append(("fusedrope-py", timed(ffwd), timed(fbwd), ok,
                        "rel L2 fwd %.2g bwd %.2g; vs the unfused norm + library rope: "
                        "%.4f%% identical, max %.2g ulp" % (ef, eb, 100 * same_frac, ulp_max)))

    print("peers_norm: torch %s, device %s, %s %s, q [%d,%d,%d,%d] k [%d,%d,%d,%d], %d calls "
          "(medians); copy %.1f GB/s (fwd bytes), %.1f GB/s (bwd bytes)"
          % (torch.__version__, a.device, a.family, a.dtype, B, S, HQ, D, B, S, HK, D, a.iters,
             fwd_bytes / copy_fwd / 1e9, bwd_bytes / copy_bwd / 1e9))
    print("%-14s %10s %8s %8s %10s %8s %8s  %s" % ("impl", "fwd ms", "GB/s", "of copy",
                                                 "bwd ms", "GB/s", "of copy", "check"))
    for name, tf, tb, ok, note in results:
        print("%-14s %10.3f %8.1f %8.3f %10.3f %8.1f %8.3f  %s %s"
              % (name, tf * 1e3, fwd_bytes / tf / 1e9, copy_fwd / tf, tb * 1e3,
                 bwd_bytes / tb / 1e9 if tb > 0 else math.inf,
                 copy_bwd / tb if tb > 0 else math.inf, "ok" if ok else "FAIL", note))
    print("(torch backward = forward+backward minus forward; its autograd also recomputes "
          "nothing: the activations are kept)")
    if bench_rc != 0:
        print("fusedrope-bench (--bench) exited %d: FAIL" % bench_rc)
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
