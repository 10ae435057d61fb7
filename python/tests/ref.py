"""Float64 reference for the tests, written from the formulas of
/work/shared/DESIGN.md and fusedrope_cache_create(3) -- never from the
library's code or results.  Also bit conversions for bfloat16 and the
precision bound of DESIGN ("Precision")."""
import math
import os
import zlib

import numpy as np

SEED = int(os.environ.get("FUSEDROPE_TEST_SEED", "20261123"))


def rng(salt=0):
    return np.random.default_rng(SEED + salt)


def salt(*key):
    """A case's salt for rng(), the same in every process (Python's hash()
    of strings is salted per process, so a printed seed would not
    reproduce the data)."""
    return zlib.crc32(repr(key).encode()) % 1000


# ----------------------------------------------------------------- rope types

def inv_freq(type, d, theta, max_positions, factor=None, original_max_positions=0, seq_len=0,
             attention_factor=0.0, beta_fast=32.0, beta_slow=1.0, mscale=0.0,
             mscale_all_dim=0.0, truncate=True, low_freq_factor=1.0, high_freq_factor=4.0,
             short_factor=None, long_factor=None):
    """(inv_i for i < d/2, attention factor) in float64.  Defaults are
    fusedrope_cache_create(3)'s: factor 1 (longrope: 0, derived)."""
    if factor is None:
        factor = 0.0 if type == "longrope" else 1.0
    i = np.arange(d // 2, dtype=np.float64)
    e = 2.0 * i / d
    base_inv = theta ** (-e)
    orig = original_max_positions
    if type == "default":
        return base_inv, 1.0
    if type == "linear":
        return base_inv / factor, 1.0
    if type == "dynamic":
        L = max(seq_len or max_positions, orig)
        b = theta * (factor * L / orig - (factor - 1.0)) ** (d / (d - 2.0))
        return b ** (-e), 1.0
    if type == "yarn":
        def m(s, k):
            return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0
        if attention_factor:
            a = attention_factor
        elif mscale and mscale_all_dim:
            a = m(factor, mscale) / m(factor, mscale_all_dim)
        else:
            a = m(factor, 1.0)

        def corr(r):
            return d * math.log(orig / (2 * math.pi * r)) / (2 * math.log(theta))
        lo, hi = corr(beta_fast), corr(beta_slow)
        if truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((i - lo) / (hi - lo), 0.0, 1.0)
        return (1 - ramp) * base_inv + ramp * base_inv / factor, a
    if type == "longrope":
        f = np.asarray(long_factor if max_positions > orig else short_factor, np.float64)
        s = factor if factor else max_positions / orig
        if attention_factor:
            a = attention_factor
        elif s <= 1:
            a = 1.0
        else:
            a = math.sqrt(1 + math.log(s) / math.log(orig))
        return base_inv / f, a
    if type == "llama3":
        w = 2 * math.pi / base_inv
        lo_w, hi_w = orig / low_freq_factor, orig / high_freq_factor
        if high_freq_factor == low_freq_factor:   # no band between (Llama 4 Scout)
            return np.where(w > lo_w, base_inv / factor, base_inv), 1.0
        t = (orig / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
        out = np.where(w < hi_w, base_inv,
                       np.where(w > lo_w, base_inv / factor,
                                (1 - t) * base_inv / factor + t * base_inv))
        return out, 1.0
    raise ValueError(type)


def table(positions, inv, a):
    ang = np.asarray(positions, np.float64)[..., None] * inv
    return np.cos(ang) * a, np.sin(ang) * a


# ------------------------------------------------------------------ dtypes

def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f64(b):
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# (mantissa bits, smallest normal exponent)
_FMT = {"float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}


def ulp(x, dtype):
    mant, emin = _FMT[dtype]
    ax = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    e = np.maximum(np.where(ax > 0, e, emin), emin)
    return np.exp2(e - mant)


def make(shape, dtype, r, scale=4.0):
    """(array as passed to the library, its exact float64 values)."""
    v = (r.standard_normal(shape) * scale).astype(np.float32)
    if dtype == "float32":
        return v, v.astype(np.float64)
    if dtype == "float16":
        h = v.astype(np.float16)
        return h, h.astype(np.float64)
    b = f32_to_bf16_bits(v)
    return b, bf16_bits_to_f64(b)


BF16_POISON = 0x7FC1   # a bfloat16 NaN, the bits outputs are filled with before a call


def poison(a, dtype):
    """Fills a with NaN (bfloat16: BF16_POISON), so an element a call left
    unwritten shows."""
    a[...] = BF16_POISON if dtype == "bfloat16" else np.nan


def to_f64(a, dtype):
    return bf16_bits_to_f64(a) if dtype == "bfloat16" else np.asarray(a).astype(np.float64)


# --------------------------------------------------------------- rotation

def rotate(x, pos, cos_t, sin_t, rot_dim, style, backward=False):
    """x: float64 [tokens..., heads, head_dim]; pos: int positions of shape
    x.shape[:-2]; cos_t/sin_t: float64 [P, rot_dim/2].  Returns (y, |a|+|b|
    per output element)."""
    y = x.copy()
    half = rot_dim // 2
    c = cos_t[pos][..., None, :]
    s = sin_t[pos][..., None, :]
    if backward:
        s = -s
    if style == "neox":
        ia, ib = np.arange(half), np.arange(half) + half
    else:
        ia, ib = np.arange(0, rot_dim, 2), np.arange(1, rot_dim, 2)
    a, b = x[..., ia], x[..., ib]
    y[..., ia] = a * c - b * s
    y[..., ib] = b * c + a * s
    mag = np.zeros_like(x)
    mag[..., ia] = np.abs(a) + np.abs(b)
    mag[..., ib] = np.abs(a) + np.abs(b)
    return y, mag


def assert_close(got, ref, mag, dtype, attn=1.0, what=""):
    """DESIGN's bound: |y - ref| <= ulp(ref) + 2^-22 (|a|+|b|) max(1, a)."""
    bound = ulp(ref, dtype) + 2.0 ** -22 * mag * max(1.0, attn)
    err = np.abs(got - ref)
    bad = ~(err <= bound)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {bad.sum()} of {bad.size} elements outside the bound (seed {SEED}); "
            f"first at {idx}: got {got[idx]!r}, ref {ref[idx]!r}, bound {bound[idx]!r}")
