"""PyTorch and Hugging Face transformers checks; each part skips cleanly where
its package is absent (CI installs neither).

Checked locally against torch 2.15.0 (CPU) and transformers 5.23.0.
"""
import math

import numpy as np
import pytest

import fusedrope
import ref
from fusedrope._hf import cache_arguments

# Real model configs (config.json excerpts).  Phi-3's 48 short/long factors
# are not reproduced here: synthetic increasing lists of the right length
# stand in for them (the mapping does not depend on their values).
LLAMA31 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN3 = {"model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128,
         "num_key_value_heads": 8, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
         "rope_scaling": None}
QWEN25_YARN = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
               "num_key_value_heads": 4, "max_position_embeddings": 32768,
               "rope_theta": 1000000.0,
               "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                                "type": "yarn"}}
PHI3_LONGROPE = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "max_position_embeddings": 131072,
                 "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                 "rope_scaling": {"type": "longrope",
                                  "short_factor": [1.0 + 0.02 * i for i in range(48)],
                                  "long_factor": [1.0 + 1.3 * i for i in range(48)]}}
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
           "head_dim": 64, "num_key_value_heads": 8, "max_position_embeddings": 131072,
           "rope_theta": 150000.0,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                            "original_max_position_embeddings": 4096, "rope_type": "yarn",
                            "truncate": False}}
CONFIGS = {"llama3.1": LLAMA31, "qwen3": QWEN3, "qwen2.5-yarn": QWEN25_YARN,
           "phi3-longrope": PHI3_LONGROPE, "gpt-oss": GPT_OSS}


# -------------------------------------------- the mapping (no torch needed)

def test_mapping_without_transformers():
    a = cache_arguments(LLAMA31)
    assert a == dict(type="llama3", rot_dim=128, max_positions=131072, theta=500000.0,
                     original_max_positions=8192, factor=8.0, low_freq_factor=1.0,
                     high_freq_factor=4.0)
    a = cache_arguments(QWEN3)
    assert a == dict(type="default", rot_dim=128, max_positions=40960, theta=1e6)
    a = cache_arguments(QWEN25_YARN, max_positions=131072)
    assert (a["type"], a["rot_dim"], a["factor"], a["original_max_positions"], a["truncate"],
            a["beta_fast"], a["beta_slow"], a["max_positions"]) == (
               "yarn", 128, 4.0, 32768, True, 32.0, 1.0, 131072)
    a = cache_arguments(PHI3_LONGROPE)
    # Phi-3: original from the top level, factor = 131072 / 4096
    assert (a["type"], a["rot_dim"], a["original_max_positions"], a["factor"]) == (
        "longrope", 96, 4096, 32.0)
    a = cache_arguments(GPT_OSS)
    assert a["truncate"] is False and a["rot_dim"] == 64 and a["factor"] == 32.0
    su = dict(PHI3_LONGROPE, rope_scaling=dict(PHI3_LONGROPE["rope_scaling"], type="su"))
    assert cache_arguments(su)["type"] == "longrope"
    dyn = dict(QWEN3, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    a = cache_arguments(dyn, seq_len=100000)
    assert (a["original_max_positions"], a["seq_len"]) == (40960, 100000)
    v5 = dict(QWEN3, rope_scaling=None, rope_theta=None, partial_rotary_factor=None,
              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5,
                               "partial_rotary_factor": 0.5})
    a = cache_arguments(v5)
    assert (a["type"], a["theta"], a["rot_dim"], a["factor"]) == ("linear", 5e5, 64, 2.0)


def test_mapping_unsupported():
    mrope = dict(QWEN3, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
    with pytest.raises(NotImplementedError, match="mrope_section"):
        fusedrope.Cache.from_config(mrope)
    with pytest.raises(NotImplementedError, match="proportional"):
        fusedrope.Cache.from_config(dict(QWEN3, rope_scaling={"rope_type": "proportional"}))
    nested = dict(QWEN3, rope_parameters={"full_attention": {"rope_type": "default"},
                                          "sliding_attention": {"rope_type": "default",
                                                                "rope_theta": 1e4}})
    with pytest.raises(NotImplementedError, match="layer_type"):
        fusedrope.Cache.from_config(nested)
    c = fusedrope.Cache.from_config(nested, layer_type="sliding_attention", max_positions=8)
    assert c.rot_dim == 128


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_from_config_table_matches_reference(name):
    """Cache.from_config's table against ref.py's formulas for the mapped
    arguments (small max_positions keeps it quick)."""
    args = cache_arguments(CONFIGS[name], max_positions=CONFIGS[name]["max_position_embeddings"])
    cache = fusedrope.Cache.from_config(CONFIGS[name])
    cos, sin = cache.table()
    kw = {k: v for k, v in args.items() if k not in ("type", "rot_dim", "max_positions", "theta")}
    inv, a = ref.inv_freq(args["type"], args["rot_dim"], args["theta"], args["max_positions"], **kw)
    p = np.array([0, 1, 7, 4095, args["max_positions"] - 1])
    rc, rs = ref.table(p, inv, a)
    assert (np.abs(cos[p] - rc) <= ref.ulp(rc, "float32")).all()
    assert (np.abs(sin[p] - rs) <= ref.ulp(rs, "float32")).all()


# ------------------------------------------------------------ transformers

def _hf(name, **over):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    cfg = dict(CONFIGS[name], **over)
    return transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def _hf_inv(hf_config, seq_len=None):
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rp = hf_config.rope_parameters
    if rp["rope_type"] == "default":   # in each model class since transformers 5
        dim = int((getattr(hf_config, "head_dim", None)
                   or hf_config.hidden_size // hf_config.num_attention_heads)
                  * rp.get("partial_rotary_factor", 1.0))
        inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv.double().numpy(), 1.0
    inv, att = ROPE_INIT_FUNCTIONS[rp["rope_type"]](hf_config, "cpu", seq_len=seq_len)
    return inv.double().numpy(), float(att)


def _lib_inv(cache):
    """The library's inverse frequencies and attention factor, read back
    from rows 0 and 1 of its table (every inv_i < pi here)."""
    cos, sin = cache.table()
    a = cos[0].astype(np.float64)
    return np.arctan2(sin[1].astype(np.float64), cos[1].astype(np.float64)), float(a[0])


@pytest.mark.parametrize("name,max_positions,seq_len", [
    ("llama3.1", None, None), ("qwen3", None, None), ("qwen2.5-yarn", 131072, None),
    ("gpt-oss", None, None),
    ("phi3-longrope", 4096, None),       # short factors: HF at or below the original context
    ("phi3-longrope", None, 131072),     # long factors: HF past the original context
])
def test_rope_init_functions(name, max_positions, seq_len):
    hf_config = _hf(name)
    inv_hf, att_hf = _hf_inv(hf_config, seq_len)
    cache = fusedrope.Cache.from_config(hf_config, max_positions=max_positions or 64)
    if max_positions is None and seq_len:
        cache = fusedrope.Cache.from_config(hf_config)
    inv, att = _lib_inv(cache)
    # transformers computes inv_freq in float32 (base ** (i/d) with a
    # float32 exponent: a few 1e-7 relative); the library in double.
    np.testing.assert_allclose(inv, inv_hf, rtol=5e-6, atol=0)
    assert math.isclose(att, att_hf, rel_tol=2e-7), (att, att_hf)
    # the PretrainedConfig and its config.json dict map alike
    assert cache_arguments(hf_config, max_positions=7) == cache_arguments(CONFIGS[name],
                                                                         max_positions=7)


def test_dynamic_against_transformers():
    hf_config = _hf("qwen3", rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    for seq_len in (None, 100000):
        inv_hf, _ = _hf_inv(hf_config, seq_len)
        cache = fusedrope.Cache.from_config(hf_config, max_positions=64, seq_len=seq_len)
        inv, _ = _lib_inv(cache)
        np.testing.assert_allclose(inv, inv_hf, rtol=5e-6, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_apply_rotary_pos_emb(dtype):
    """forward_qk on [b, s, h, d] torch tensors (GQA) against transformers'
    apply_rotary_pos_emb in float64 on [b, h, s, d], with the cache's table."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cache = fusedrope.Cache.from_config(LLAMA31, max_positions=2048)
    cos_t, sin_t = (torch.from_numpy(t).double() for t in cache.table())
    b, s, hq, hk, d = 2, 9, 4, 2, 128
    g = torch.Generator().manual_seed(ref.SEED)
    tdt = getattr(torch, dtype)
    q = (torch.randn(b, s, hq, d, generator=g) * 3).to(tdt)
    k = (torch.randn(b, s, hk, d, generator=g) * 3).to(tdt)
    pos = torch.randint(0, 2048, (b, s), generator=g)
    cos = torch.cat([cos_t, cos_t], -1)[pos]           # [b, s, d]
    sin = torch.cat([sin_t, sin_t], -1)[pos]
    rq, rk = apply_rotary_pos_emb(q.double().transpose(1, 2), k.double().transpose(1, 2), cos,
                                  sin)
    qo, ko = fusedrope.forward_qk(cache, q, k, layout="bshd", ids=pos,
                                  out=(torch.empty_like(q), torch.empty_like(k)))
    for got, want, src in ((qo, rq.transpose(1, 2), q), (ko, rk.transpose(1, 2), k)):
        x = src.double().numpy()
        half = d // 2
        mag = np.abs(x[..., :half]) + np.abs(x[..., half:])
        ref.assert_close(got.double().numpy(), want.numpy(), np.concatenate([mag, mag], -1),
                         dtype, what="apply_rotary_pos_emb")


# ------------------------------------------------------------- autograd

def _torch_ref(x, pos, cache, style):
    """float64 forward in torch, from the cache's table: x [s, b, h, d]."""
    import torch
    cos_t, sin_t = (torch.from_numpy(t).double() for t in cache.table())
    c, s_ = cos_t[pos][:, :, None, :], sin_t[pos][:, :, None, :]
    half = cache.rot_dim // 2
    if style == "neox":
        a, b = x[..., :half], x[..., half:cache.rot_dim]
        return torch.cat([a * c - b * s_, b * c + a * s_, x[..., cache.rot_dim:]], -1)
    a, b = x[..., 0:cache.rot_dim:2], x[..., 1:cache.rot_dim:2]
    rot = torch.stack([a * c - b * s_, b * c + a * s_], -1).flatten(-2)
    return torch.cat([rot, x[..., cache.rot_dim:]], -1)


@pytest.mark.parametrize("style", ["neox", "interleaved"])
def test_gradients(style):
    torch = pytest.importorskip("torch")
    from fusedrope.torch import RopeQKFunction, rope, rope_qk
    cache = fusedrope.Cache("yarn", rot_dim=8, max_positions=32, factor=4.0,
                            original_max_positions=8)
    g = torch.Generator().manual_seed(ref.SEED)
    s, b, d = 5, 2, 12
    q = torch.randn(s, b, 3, d, generator=g, requires_grad=True)
    k = torch.randn(s, b, 1, d, generator=g, requires_grad=True)
    offsets = torch.tensor([3, 11])
    pos = (torch.arange(s)[:, None] + offsets[None, :])
    gq, gk = torch.randn(s, b, 3, d, generator=g), torch.randn(s, b, 1, d, generator=g)

    for fn in (rope_qk, lambda q, k, c, **kw: RopeQKFunction.apply(
            q, k, c.id, kw["style"], "sbhd", False, None, kw["offsets"], None, 1, 0)):
        qo, ko = fn(q, k, cache, style=style, offsets=offsets)
        dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
        q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
        rq, rk = _torch_ref(q64, pos, cache, style), _torch_ref(k64, pos, cache, style)
        torch.testing.assert_close(qo.double(), rq, rtol=0, atol=1e-5)
        rdq, rdk = torch.autograd.grad((rq, rk), (q64, k64), (gq.double(), gk.double()))
        torch.testing.assert_close(dq.double(), rdq, rtol=0, atol=1e-5)
        torch.testing.assert_close(dk.double(), rdk, rtol=0, atol=1e-5)

    # gradcheck on float32: the op is linear, so central differences are
    # exact up to float32 rounding
    x = torch.randn(4, 1, 2, 8, generator=g, requires_grad=True)
    with pytest.warns(UserWarning):
        assert torch.autograd.gradcheck(lambda t: rope(t, cache, style=style), (x,), eps=1e-2,
                                        atol=2e-3, rtol=1e-3)
    assert torch.autograd.gradcheck(lambda a, c: rope_qk(a, c, cache, style=style),
                                    (x, x.detach().clone().requires_grad_()), eps=1e-2,
                                    atol=2e-3, rtol=1e-3)


def test_custom_op_compiles_into_one_graph():
    torch = pytest.importorskip("torch")
    import fusedrope.torch as ft
    if not ft._HAS_CUSTOM_OP:
        pytest.skip("torch.library.custom_op not available")
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    torch.library.opcheck(torch.ops.fusedrope.rope_qk.default,
                          (torch.randn(3, 2, 2, 8), torch.randn(3, 2, 1, 8), cache.id, "neox",
                           "sbhd", False, None, None, None, 1, 0))

    def f(q, k):
        qo, ko = ft.rope_qk(q * 2, k, cache)
        return (qo * ko.sum()).sum()

    q = torch.randn(3, 2, 2, 8, requires_grad=True)
    k = torch.randn(3, 2, 1, 8, requires_grad=True)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k)
    torch.testing.assert_close(out, f(q, k))
    gc = torch.autograd.grad(out, (q, k))
    ge = torch.autograd.grad(f(q, k), (q, k))
    torch.testing.assert_close(gc, ge)


def test_torch_errors():
    torch = pytest.importorskip("torch")
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    x = torch.randn(4, 2, 3, 8, requires_grad=True)
    from fusedrope.torch import rope
    with pytest.raises(ValueError, match="contiguous"):
        rope(torch.randn(4, 2, 3, 16)[..., ::2], cache)
    with pytest.raises(fusedrope.Error):
        rope(x, cache, ids=torch.full((2, 4), 99))
    with pytest.raises(TypeError, match="Cache"):
        rope(x, "cache")
    y = rope(torch.randn(4, 2, 3, 8, dtype=torch.bfloat16), cache)
    assert y.dtype == torch.bfloat16
