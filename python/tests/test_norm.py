"""Tests of norm_forward_qk / norm_backward_qk (fused per-head RMSNorm +
RoPE) through the binding.

- Each rounding mode against an unfused evaluation: the norm computed here
  in NumPy float32 as fusedrope_norm_forward_qk(3) specifies it (its
  reduction order is part of the contract), rounded where the mode says,
  then the library's plain forward_qk: the same bytes.
- float32 against a float64 reference of norm + RoPE and of its gradients.
- Against transformers' own Qwen3RMSNorm and Gemma3RMSNorm where PyTorch and
  transformers are installed (skipped otherwise).
- Bad arguments raise, and nothing is written.
The seed is printed in assertion messages (FUSEDROPE_TEST_SEED sets it).
"""
import numpy as np
import pytest

import fusedrope
import ref

NP_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
MODES = ["once", "llama", "gemma"]
WEIGHTS = ["none", "w", "1+w"]


def to_dtype(v32, dtype):
    """float32 values rounded to the dtype, as the library stores them."""
    v32 = np.asarray(v32, np.float32)
    if dtype == "float32":
        return v32.copy()
    if dtype == "float16":
        return v32.astype(np.float16)
    return ref.f32_to_bf16_bits(v32)


def widen(a, dtype):
    """The dtype's values as float32 (exact)."""
    return ref.to_f64(a, dtype).astype(np.float32)


def row_rstd(x32, eps):
    """rstd per row, in float32, in the documented order: 32 partial sums
    (channel c into partial c % 32, in channel order), the tree 16, 8, 4, 2,
    1, then sum / head_dim + eps, sqrt, 1 / that."""
    d = x32.shape[-1]
    sq = x32 * x32
    p = np.zeros(x32.shape[:-1] + (32,), np.float32)
    for j in range(0, d, 32):
        m = min(32, d - j)
        p[..., :m] = p[..., :m] + sq[..., j:j + m]
    for off in (16, 8, 4, 2, 1):
        p[..., :off] = p[..., :off] + p[..., off:2 * off]
    mean = p[..., 0] / np.float32(d)
    return np.float32(1.0) / np.sqrt(mean + np.float32(eps))


def unfused_v(x, dtype, w, weight, mode, eps):
    """(v as the rotation receives it: float32 for 'once', else the dtype;
    rstd float32)."""
    x32 = widen(x, dtype)
    rstd = row_rstd(x32, eps)
    n = x32 * rstd[..., None]
    if weight == "none":
        wp = np.ones(x.shape[-1], np.float32)
    else:
        wp = widen(w, dtype if w.dtype != np.float32 else "float32")
        if weight == "1+w":
            wp = np.float32(1.0) + wp
    if mode == "once":
        return n * wp, rstd
    if mode == "llama":
        n = widen(to_dtype(n, dtype), dtype)
    return to_dtype(n * wp, dtype), rstd


def make_case(r, dtype, S=5, B=2, HQ=4, HK=2, D=64, wdtype=None):
    q, _ = ref.make((S, B, HQ, D), dtype, r, scale=3.0)
    k, _ = ref.make((S, B, HK, D), dtype, r, scale=0.5)
    wd = wdtype or dtype
    qw, _ = ref.make((D,), wd, r, scale=0.6)
    kw, _ = ref.make((D,), wd, r, scale=0.6)
    return q, k, qw, kw


def cache_for(D, rot=None):
    return fusedrope.Cache("default", rot_dim=rot or D, max_positions=64, theta=10000.0)


def bf16_kw(dtype):
    return {"dtype": "bfloat16"} if dtype == "bfloat16" else {}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("f32w", [False, True])
def test_forward_equals_unfused(dtype, mode, weight, style, f32w):
    if f32w and (dtype == "float32" or weight == "none"):
        pytest.skip("float32 weights: the same case as the tensors' dtype here")
    r = ref.rng(101)
    D, rot = 80, 64  # partial rotary: channels 64..79 normalised, not rotated
    q, k, qw, kw = make_case(r, dtype, D=D, wdtype="float32" if f32w else None)
    cache = cache_for(D, rot)
    eps = 1e-6
    w = (qw, kw) if weight != "none" else (None, None)
    qo = np.empty_like(q)
    ko = np.empty_like(k)
    qo.view(np.uint8)[...] = 0xFF
    ko.view(np.uint8)[...] = 0xFF
    rq = np.full(q.shape[1::-1] + q.shape[2:3], np.nan, np.float32)  # [batch, seq, heads]
    rk = np.full(k.shape[1::-1] + k.shape[2:3], np.nan, np.float32)
    fusedrope.norm_forward_qk(cache, q, k, w[0], w[1], weight=weight, rounding=mode, eps=eps,
                              rstd=(rq, rk), style=style, out=(qo, ko), **bf16_kw(dtype))
    vq, sq = unfused_v(q, dtype, qw, weight, mode, eps)
    vk, sk = unfused_v(k, dtype, kw, weight, mode, eps)
    vdt = "float32" if mode == "once" else dtype
    v64 = [ref.to_f64(v, vdt) for v in (vq, vk)]    # the rotation's inputs, exactly
    if mode == "once":
        # one rounding: the float32 rotation of v, rounded to the dtype once
        fusedrope.forward_qk(cache, vq, vk, style=style)
        eq, ek = to_dtype(vq, dtype), to_dtype(vk, dtype)
    else:
        fusedrope.forward_qk(cache, vq, vk, style=style, **bf16_kw(dtype))
        eq, ek = vq, vk
    seed = f"seed {ref.SEED}, {dtype} {mode} {weight} {style} float32 weights {f32w}"
    # the unfused evaluation's rotation (the library's forward_qk) against
    # the float64 reference, so that a fault it shares with the fused call
    # cannot pass as agreement
    inv, a = ref.inv_freq("default", rot, 10000.0, 64)
    cos_t, sin_t = ref.table(np.arange(64), inv, a)
    pos = np.broadcast_to(np.arange(q.shape[0])[:, None], q.shape[:2])
    for got, v, name in ((eq, v64[0], "q"), (ek, v64[1], "k")):
        want, mag = ref.rotate(v, pos, cos_t, sin_t, rot, style)
        ref.assert_close(ref.to_f64(got, dtype), want, mag, dtype, what=f"{name} ({seed})")
    assert np.array_equal(qo.view(np.uint8), eq.view(np.uint8)), f"q differs ({seed})"
    assert np.array_equal(ko.view(np.uint8), ek.view(np.uint8)), f"k differs ({seed})"
    # rstd is [batch][seq][heads]; the reference's rows are [seq][batch][heads]
    assert np.array_equal(rq, sq.transpose(1, 0, 2)), f"q rstd differs ({seed})"
    assert np.array_equal(rk, sk.transpose(1, 0, 2)), f"k rstd differs ({seed})"


@pytest.mark.parametrize("axes,sections", [("sections", [8, 12, 12]),
                                           ("interleaved", [12, 10, 10])])
def test_forward_with_position_axes_equals_unfused(axes, sections):
    """A multimodal cache and a row of ids per axis (a view of a persistent
    [3, max_tokens] buffer): the same bytes as the unfused norm followed by
    the library's forward_qk with the same ids."""
    r = ref.rng(505)
    S, B, HQ, HK, D = 6, 2, 4, 2, 64
    q, k, qw, kw = make_case(r, "bfloat16", S=S, B=B, HQ=HQ, HK=HK, D=D)
    cache = fusedrope.Cache("default", rot_dim=D, max_positions=64, theta=1e6, axes=axes,
                            sections=sections)
    buf = np.zeros((3, 40), np.int64)
    buf[:, :B * S] = r.integers(0, 64, size=(3, B * S))
    ids = buf[:, :B * S].reshape(3, B, S)
    qo, ko = np.empty_like(q), np.empty_like(k)
    fusedrope.norm_forward_qk(cache, q, k, qw, kw, rounding="llama", ids=ids, out=(qo, ko),
                              dtype="bfloat16")
    vq, _ = unfused_v(q, "bfloat16", qw, "w", "llama", 1e-6)
    vk, _ = unfused_v(k, "bfloat16", kw, "w", "llama", 1e-6)
    fusedrope.forward_qk(cache, vq, vk, ids=ids, dtype="bfloat16")
    assert np.array_equal(qo, vq) and np.array_equal(ko, vk), f"{axes} (seed {ref.SEED})"


def ref_norm_rope(x, w, weight, eps, pos, cos_t, sin_t, rot, style):
    """float64: y = RoPE(n * w'), with n, rstd, w' for the backward."""
    rstd = 1.0 / np.sqrt((x * x).mean(-1) + eps)
    n = x * rstd[..., None]
    wp = np.ones(x.shape[-1]) if weight == "none" else (w if weight == "w" else 1.0 + w)
    y, mag = ref.rotate(n * wp, pos, cos_t, sin_t, rot, style)
    return y, mag, n, rstd, wp


def ref_norm_rope_backward(dy, n, rstd, wp, pos, cos_t, sin_t, rot, style):
    g, _ = ref.rotate(dy, pos, cos_t, sin_t, rot, style, backward=True)
    dn = g * wp
    dx = rstd[..., None] * (dn - n * (dn * n).mean(-1, keepdims=True))
    dw = (g * n).reshape(-1, n.shape[-1]).sum(0)
    return dx, dw


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("weight", WEIGHTS)
def test_float32_against_float64(layout, weight):
    r = ref.rng(202)
    S, B, HQ, HK, D = 7, 2, 3, 1, 48
    if layout == "thd":
        B = 1
    shp = {"sbhd": (S, B), "bshd": (B, S), "thd": (S,)}[layout]
    q = (r.standard_normal(shp + (HQ, D)) * 2).astype(np.float32)
    k = (r.standard_normal(shp + (HK, D)) * 2).astype(np.float32)
    qw = (r.standard_normal(D) * 0.5).astype(np.float32)
    kw = (r.standard_normal(D) * 0.5).astype(np.float32)
    eps = 1e-5
    cache = cache_for(D)
    inv, a = ref.inv_freq("default", D, 10000.0, 64)
    cos_t, sin_t = ref.table(np.arange(64), inv, a)
    pos = np.broadcast_to(np.arange(S), shp[::-1]).T if layout == "sbhd" else (
        np.broadcast_to(np.arange(S), shp))
    w = (qw, kw) if weight != "none" else (None, None)
    rshape = (S, HQ) if layout == "thd" else (B, S, HQ)
    rq = np.empty(rshape, np.float32)
    rk = np.empty(rshape[:-1] + (HK,), np.float32)
    qo, ko = np.full_like(q, np.nan), np.full_like(k, np.nan)
    fusedrope.norm_forward_qk(cache, q, k, *w, weight=weight, eps=eps, rstd=(rq, rk),
                              layout=layout, out=(qo, ko))
    for x, wv, got, rs, name in ((q, qw, qo, rq, "q"), (k, kw, ko, rk, "k")):
        y, mag, n, rstd, wp = ref_norm_rope(x.astype(np.float64), wv.astype(np.float64),
                                            weight, eps, pos, cos_t, sin_t, D, "neox")
        # the norm's few float32 roundings before the rotation's bound
        err = np.abs(got - y)
        bound = ref.ulp(y, "float32") + 2.0 ** -19 * mag
        assert (err <= bound).all(), f"{name} forward, seed {ref.SEED}: max err {err.max()}"
        rs_ref = rstd.transpose(1, 0, 2) if layout == "sbhd" else rstd
        assert np.allclose(rs, rs_ref, rtol=2e-6, atol=0), f"{name} rstd, seed {ref.SEED}"

    # backward from the saved inputs and from the saved outputs
    dq = r.standard_normal(q.shape).astype(np.float32)
    dk = r.standard_normal(k.shape).astype(np.float32)
    for saved_output in (False, True):
        gq = np.full(D, np.nan, np.float32)
        gk = np.full(D, np.nan, np.float32)
        dqi, dki = np.full_like(q, np.nan), np.full_like(k, np.nan)
        sq, sk = (qo, ko) if saved_output else (q, k)
        fusedrope.norm_backward_qk(cache, sq, dq, sk, dk, *w, weight=weight, eps=eps,
                                   rstd=(rq, rk), saved_output=saved_output,
                                   dweight=(gq, gk) if weight != "none" else None,
                                   layout=layout, out=(dqi, dki))
        for x, wv, dy, got, gw, name in ((q, qw, dq, dqi, gq, "q"), (k, kw, dk, dki, gk, "k")):
            _, _, n, rstd, wp = ref_norm_rope(x.astype(np.float64), wv.astype(np.float64),
                                              weight, eps, pos, cos_t, sin_t, D, "neox")
            dx, dw = ref_norm_rope_backward(dy.astype(np.float64), n, rstd, wp, pos, cos_t,
                                            sin_t, D, "neox")
            scale = np.abs(dx).max()
            assert np.abs(got - dx).max() <= 2e-5 * scale, (
                f"d{name} (saved_output={saved_output}), seed {ref.SEED}: "
                f"max err {np.abs(got - dx).max()} of {scale}")
            if weight != "none":
                dws = np.abs(dw).max()
                assert np.abs(gw - dw).max() <= 2e-5 * dws, (
                    f"d{name}_weight (saved_output={saved_output}), seed {ref.SEED}")


def test_q_only_and_in_place_and_deterministic():
    r = ref.rng(303)
    q, k, qw, kw = make_case(r, "bfloat16", S=9, B=3, HQ=5, D=64)
    cache = cache_for(64)
    rq = np.empty((3, 9, 5), np.float32)
    qo = q.copy()
    fusedrope.norm_forward_qk(cache, qo, None, qw, weight="w", rounding="llama",
                              rstd=(rq, None), dtype="bfloat16")  # in place
    q2 = np.empty_like(q)
    fusedrope.norm_forward_qk(cache, q, None, qw, weight="w", rounding="llama", out=(q2, None),
                              dtype="bfloat16")
    assert np.array_equal(qo, q2), f"in place differs from out of place (seed {ref.SEED})"
    dq = ref.make(q.shape, "bfloat16", r)[0]
    outs = []
    for _ in range(2):
        g = np.empty(64, np.float32)
        dqi = np.empty_like(dq)
        fusedrope.norm_backward_qk(cache, q, dq, None, None, qw, weight="w", rounding="llama",
                                   rstd=(rq, None), dweight=(g, None), out=(dqi, None),
                                   dtype="bfloat16")
        outs.append((dqi, g))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(
        outs[0][1].view(np.uint32), outs[1][1].view(np.uint32)), "two backward calls differ"


def test_bad_arguments_write_nothing():
    r = ref.rng(404)
    q, k, qw, kw = make_case(r, "float32", D=64)
    cache = cache_for(64)
    qo = np.full_like(q, 7.0)
    ko = np.full_like(k, 7.0)

    def untouched():
        assert (qo == 7.0).all() and (ko == 7.0).all(), "a failed call wrote its output"

    with pytest.raises(fusedrope.Error, match="eps"):
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, eps=0.0, out=(qo, ko))
    untouched()
    with pytest.raises(fusedrope.Error, match="eps"):
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, eps=float("nan"), out=(qo, ko))
    untouched()
    with pytest.raises(fusedrope.Error):  # the weight is needed
        fusedrope.norm_forward_qk(cache, q, k, None, None, weight="w", out=(qo, ko))
    untouched()
    with pytest.raises(ValueError, match="weight must be"):
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, weight="2w", out=(qo, ko))
    with pytest.raises(ValueError, match="rounding must be"):
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, rounding="twice", out=(qo, ko))
    with pytest.raises(ValueError, match="shape"):  # rstd of the wrong shape
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, out=(qo, ko),
                                  rstd=(np.empty((3, 3), np.float32), None))
    with pytest.raises(TypeError, match="float32"):  # rstd of the wrong dtype
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, out=(qo, ko),
                                  rstd=(np.empty((2, 5, 4), np.float64), None))
    with pytest.raises(ValueError, match="shape"):  # a weight of the wrong length
        fusedrope.norm_forward_qk(cache, q, k, qw[:32], kw, out=(qo, ko))
    with pytest.raises(ValueError, match="k_weight given without k"):
        fusedrope.norm_forward_qk(cache, q, None, qw, kw, out=(qo, None))
    with pytest.raises(fusedrope.Error):  # a float16 weight with float32 tensors
        fusedrope.norm_forward_qk(cache, q, k, qw.astype(np.float16), kw.astype(np.float16),
                                  out=(qo, ko))
    untouched()
    with pytest.raises(fusedrope.Error, match="overlap"):  # rstd inside the output
        fusedrope.norm_forward_qk(cache, q, k, qw, kw, out=(qo, ko),
                                  rstd=(qo.reshape(-1)[:40].reshape(2, 5, 4), None))
    assert (ko == 7.0).all()
    rq = np.empty((2, 5, 4), np.float32)
    with pytest.raises(TypeError):  # the backward needs rstd
        fusedrope.norm_backward_qk(cache, q, q.copy(), None, None, qw)
    with pytest.raises(fusedrope.Error, match="rstd"):
        fusedrope.norm_backward_qk(cache, q, q.copy(), None, None, qw, rstd=(None, None))
    with pytest.raises(ValueError, match="k_saved and dk go together"):
        fusedrope.norm_backward_qk(cache, q, q.copy(), k, None, qw, rstd=(rq, None))


# ------------------------------------------- transformers' own modules

def _hf_case(torch, dtype):
    g = torch.Generator().manual_seed(ref.SEED)
    B, S, HQ, HK, D = 2, 11, 8, 2, 128
    q = (torch.randn(B, S, HQ, D, generator=g) * 3).to(dtype)
    k = (torch.randn(B, S, HK, D, generator=g) * 0.7).to(dtype)
    return q, k, g


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_against_transformers_rmsnorm(family):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if family == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as Norm
        weight, rounding = "w", "llama"
    else:
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm as Norm
        weight, rounding = "1+w", "gemma"
    dtype = torch.bfloat16
    q, k, g = _hf_case(torch, dtype)
    D = q.shape[-1]
    qn, kn = Norm(D, eps=1e-6), Norm(D, eps=1e-6)
    with torch.no_grad():
        for m in (qn, kn):
            m.weight.copy_(torch.randn(D, generator=g) * 0.5)
            if family == "qwen3":
                m.to(dtype)  # Qwen3 keeps its weight in the model's dtype
        want_q, want_k = qn(q), kn(k)  # the model's norm, then the library's rotation
    cache = fusedrope.Cache("default", rot_dim=D, max_positions=64, theta=1000000.0)
    want_q, want_k = want_q.contiguous(), want_k.contiguous()
    fusedrope.forward_qk(cache, want_q, want_k, layout="bshd")
    got_q, got_k = torch.empty_like(q), torch.empty_like(k)
    fusedrope.norm_forward_qk(cache, q, k, qn.weight.detach(), kn.weight.detach(),
                              weight=weight, rounding=rounding, layout="bshd",
                              out=(got_q, got_k))
    for got, want, name in ((got_q, want_q, "q"), (got_k, want_k, "k")):
        same = (got.view(torch.int16) == want.view(torch.int16)).float().mean().item()
        ulps = (got.float() - want.float()).abs() / (want.float().abs() * 2.0 ** -7 + 1e-30)
        # torch sums the squares in its own order: rstd may differ in its last bit, and then
        # an element rounds the other way; the rest is the same bytes
        assert ulps.max().item() <= 1.0, f"{family} {name}: {ulps.max().item()} ulp"
        assert same >= 0.99, f"{family} {name}: only {same:.4f} of the elements identical"


@pytest.mark.parametrize("weight", ["w", "1+w", "none"])
def test_torch_op_gradients(weight):
    """fusedrope.torch.norm_rope_qk's gradients (the library's backward)
    against PyTorch autograd of the unfused formula in float64."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    q, k, g = _hf_case(torch, torch.float32)
    D = q.shape[-1]
    S = q.shape[1]
    qw = (torch.randn(D, generator=g) * 0.5) if weight != "none" else None
    kw = (torch.randn(D, generator=g) * 0.5) if weight != "none" else None
    cache = fusedrope.Cache("default", rot_dim=D, max_positions=64, theta=10000.0)
    leaves = [t.clone().requires_grad_(True) for t in (q, k)]
    wl = [None if t is None else t.clone().requires_grad_(True) for t in (qw, kw)]
    qo, ko = frt.norm_rope_qk(leaves[0], leaves[1], wl[0], wl[1], cache, weight=weight,
                              eps=1e-6, layout="bshd")
    gq = torch.randn(qo.shape, generator=g)
    gk = torch.randn(ko.shape, generator=g)
    (qo * gq).sum().backward(retain_graph=True)
    (ko * gk).sum().backward()

    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]

    def ref(x, w):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        v = n if w is None else n * (w if weight == "w" else 1.0 + w)
        rot = torch.cat([-v[..., D // 2:], v[..., :D // 2]], -1)
        return v * cos + rot * sin

    for x, w, gy, leaf, wleaf, y, name in ((q, qw, gq, leaves[0], wl[0], qo, "q"),
                                           (k, kw, gk, leaves[1], wl[1], ko, "k")):
        xd = x.double().requires_grad_(True)
        wd = None if w is None else w.double().requires_grad_(True)
        yd = ref(xd, wd)
        assert torch.allclose(y.double(), yd, rtol=0, atol=2e-5 * yd.abs().max().item()), name
        (yd * gy.double()).sum().backward()
        scale = xd.grad.abs().max().item()
        err = (leaf.grad.double() - xd.grad).abs().max().item()
        assert err <= 2e-5 * scale, f"d{name}: {err} of {scale} (seed {ref_seed()})"
        if wd is not None:
            err = (wleaf.grad.double() - wd.grad).abs().max().item()
            assert err <= 2e-5 * wd.grad.abs().max().item(), f"d{name}_weight: {err}"


def ref_seed():
    return ref.SEED


def test_torch_op_compiles_into_one_graph():
    """torch.compile keeps norm_rope_qk (and its backward) in one graph:
    the fake implementations give the right shapes and dtypes."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    if not frt._HAS_CUSTOM_OP:
        pytest.skip("torch.library.custom_op not available")
    q, k, g = _hf_case(torch, torch.bfloat16)
    D = q.shape[-1]
    cache = fusedrope.Cache("default", rot_dim=D, max_positions=64, theta=10000.0)
    ws = [(torch.randn(D, generator=g) * 0.5).to(torch.bfloat16) for _ in range(2)]

    def f(q, k, qw, kw):
        a, b = frt.norm_rope_qk(q, k, qw, kw, cache, rounding="llama", layout="bshd")
        return (a.float() * 3).sum() + (b.float() * 2).sum()

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, *ws)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_torch_op_strided_views():
    """q and k as transposed views (sbhd over a bshd buffer: dense, not
    contiguous): the ops' outputs are laid out as their fake kernels say
    (torch.library.opcheck), so a compiled graph runs them (inductor once
    asserted on the strides), and their values equal the contiguous ones'."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt  # registers the ops
    if not frt._HAS_CUSTOM_OP:
        pytest.skip("torch.library.custom_op not available")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 5, 4, 16, generator=g).transpose(0, 1)
    k = torch.randn(2, 5, 2, 16, generator=g).transpose(0, 1)
    w = torch.randn(16, generator=g) * 0.5 + 1
    cache = fusedrope.Cache("default", rot_dim=16, max_positions=64, theta=10000.0)
    tail = (cache.id, "w", "llama", 1e-6, "neox", "sbhd", None, None, None, 1, 0)
    fwd = torch.ops.fusedrope.norm_rope_qk.default
    torch.library.opcheck(fwd, (q, k, w, w) + tail)
    out = fwd(q, k, w, w, *tail)
    dense = fwd(q.contiguous(), k.contiguous(), w, w, *tail)
    for a, b in zip(out, dense):
        assert torch.equal(a, b)
    gq, gk = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    bwd = torch.ops.fusedrope.norm_rope_qk_backward.default
    torch.library.opcheck(bwd, (q, k, w, w, out[2], out[3], gq, gk) + tail)


def test_torch_empty_backward():
    """No tokens: forward and backward run (PyTorch gives an empty tensor no
    data pointer, the rstd of no rows included), and the weights' gradients
    are zero."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    cache = fusedrope.Cache("default", rot_dim=16, max_positions=64, theta=10000.0)
    q = torch.randn(0, 2, 4, 16, requires_grad=True)
    k = torch.randn(0, 2, 2, 16, requires_grad=True)
    qw = torch.ones(16, requires_grad=True)
    kw = torch.ones(16, requires_grad=True)
    a, b = frt.norm_rope_qk(q, k, qw, kw, cache)
    (a.sum() + b.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    assert torch.equal(qw.grad, torch.zeros(16)) and torch.equal(kw.grad, torch.zeros(16))


@pytest.mark.parametrize("custom_op", [True, False])
def test_torch_compiled_with_two_caches(custom_op, monkeypatch):
    """One compiled function given two Caches (a helper shared by Gemma 3's
    local and global layers): the changed cache id became a SymInt under
    automatic dynamic shapes, and the ops' autograd set-up raised
    TypeError (unhashable SymInt) for the second cache.  Each cache now
    gets its own graph, equal to eager, for all three ops.  custom_op
    False: the autograd.Function forms, which PyTorch < 2.4 takes (compiling
    them raised there; now they run eagerly at a graph break there)."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    if custom_op and not frt._HAS_CUSTOM_OP:
        pytest.skip("torch.library.custom_op not available")
    monkeypatch.setattr(frt, "_HAS_CUSTOM_OP", custom_op)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 8, 4, 32, generator=g)
    k = torch.randn(2, 8, 2, 32, generator=g)
    caches = [fusedrope.Cache("default", rot_dim=32, max_positions=64, theta=t)
              for t in (10000.0, 1e6)]
    ops = {
        "rope_qk": lambda q, k, c: frt.rope_qk(q, k, c, layout="bshd"),
        "rope": lambda q, k, c: (frt.rope(q, c, layout="bshd"), frt.rope(k, c, layout="bshd")),
        "norm_rope_qk": lambda q, k, c: frt.norm_rope_qk(q, k, None, None, c, layout="bshd"),
    }
    for name, op in ops.items():
        torch._dynamo.reset()

        def f(q, k, cache, op=op):
            a, b = op(q, k, cache)
            return (a * a.roll(1, 1)).sum() + (b * b.roll(1, 1)).sum()

        cf = torch.compile(f, fullgraph=custom_op, backend="aot_eager")
        for c in caches:
            got, want = [], []
            for fn, out in ((cf, got), (f, want)):
                leaves = [t.clone().requires_grad_(True) for t in (q, k)]
                r = fn(*leaves, c)
                r.backward()
                out += [r.detach()] + [t.grad for t in leaves]
            for a, b in zip(got, want):
                assert torch.equal(a, b), (name, c.params)


def test_torch_norm_function_double_backward_refused():
    """NormRopeQKFunction (norm_rope_qk's form on PyTorch < 2.4) under
    create_graph=True: its gradient silently lacked the norm's
    second-order term (a gradient penalty 99% off); a double backward now
    fails as the custom op's does.  The single backward is unchanged."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    g = torch.Generator().manual_seed(8)
    cache = fusedrope.Cache("default", rot_dim=32, max_positions=64, theta=10000.0)
    q = torch.randn(2, 8, 4, 32, generator=g, requires_grad=True)
    k = torch.randn(2, 8, 2, 32, generator=g, requires_grad=True)
    tail = (cache.id, "none", "once", 1e-6, "neox", "bshd", None, None, None, 1, 0)
    a, b = frt.NormRopeQKFunction.apply(q, k, None, None, *tail)
    (gq,) = torch.autograd.grad((a ** 3).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.grad((gq ** 2).sum() + (q ** 2).sum(), q)
    a, b = frt.NormRopeQKFunction.apply(q, k, None, None, *tail)
    (once,) = torch.autograd.grad((a ** 3).sum(), q)
    want_a, _ = frt.norm_rope_qk(q, k, None, None, cache, layout="bshd")
    (want,) = torch.autograd.grad((want_a ** 3).sum(), q)
    assert torch.equal(once, want)


def test_torch_missing_k_is_a_type_error():
    """k=None (the q-only forms are fusedrope.forward and norm_forward_qk,
    or rope): a TypeError that names k, not an AttributeError from inside."""
    torch = pytest.importorskip("torch")
    import fusedrope.torch as frt
    cache = fusedrope.Cache("default", rot_dim=16, max_positions=64, theta=10000.0)
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        frt.rope_qk(q, None, cache)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        frt.norm_rope_qk(q, None, None, None, cache)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        frt.rope(None, cache)


def test_eps_is_a_number():
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    q = np.ones((2, 1, 1, 8), np.float32)
    with pytest.raises(TypeError, match="eps"):
        fusedrope.norm_forward_qk(cache, q, eps="1e-6")
