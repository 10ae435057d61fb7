"""PyTorch and Hugging Face transformers checks; each part skips cleanly where
its package is absent (CI installs neither).

Checked locally against torch 2.15.0 (CPU) and transformers 5.23.0.
"""
import math
import sys

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
# Llama 4 Scout's text config: llama3 with low_freq_factor == high_freq_factor
LLAMA4_SCOUT = {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
                "head_dim": 128, "num_key_value_heads": 8,
                "max_position_embeddings": 10485760, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0,
                                 "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192,
                                 "rope_type": "llama3"}}
CONFIGS = {"llama3.1": LLAMA31, "qwen3": QWEN3, "qwen2.5-yarn": QWEN25_YARN,
           "phi3-longrope": PHI3_LONGROPE, "gpt-oss": GPT_OSS, "llama4-scout": LLAMA4_SCOUT}

# Multimodal rope configs (config.json excerpts: Qwen2-VL-7B-Instruct with
# the legacy "mrope" type at the top level; Qwen3-VL-8B-Instruct and
# Qwen3.5 with a text_config; GLM-4.1V; Gemma 4 with rope parameters per
# layer type and a global_head_dim for its full-attention layers).
QWEN2_VL = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
QWEN3_VL = {"model_type": "qwen3_vl",
            "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                            "max_position_embeddings": 262144, "rope_theta": 5000000,
                            "rope_scaling": {"mrope_interleaved": True,
                                             "mrope_section": [24, 20, 20],
                                             "rope_type": "default"}}}
QWEN3_5 = {"model_type": "qwen3_5",
           "text_config": {"model_type": "qwen3_5_text", "hidden_size": 2048,
                           "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                           "max_position_embeddings": 262144,
                           "rope_parameters": {"mrope_interleaved": True,
                                               "mrope_section": [11, 11, 10],
                                               "rope_type": "default", "rope_theta": 10000000,
                                               "partial_rotary_factor": 0.25}}}
GLM41V = {"model_type": "glm4v",
          "text_config": {"model_type": "glm4v_text", "hidden_size": 4096,
                          "num_attention_heads": 32, "num_key_value_heads": 2,
                          "max_position_embeddings": 65536, "partial_rotary_factor": 0.5,
                          "rope_theta": 10000,
                          "rope_scaling": {"type": "default", "mrope_section": [8, 12, 12]}}}
GEMMA4 = {"model_type": "gemma4_text", "hidden_size": 2560, "num_attention_heads": 8,
          "num_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
          "max_position_embeddings": 131072,
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "proportional",
                                                 "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1000000.0}}}


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


def test_mapping_multimodal_and_proportional():
    base = dict(type="default", max_positions=7)
    assert cache_arguments(QWEN2_VL, max_positions=7) == dict(
        base, rot_dim=128, theta=1e6, axes="sections", sections=[16, 24, 24])
    assert cache_arguments(QWEN3_VL, max_positions=7) == dict(
        base, rot_dim=128, theta=5e6, axes="interleaved", sections=[24, 20, 20])
    assert cache_arguments(QWEN3_5, max_positions=7) == dict(
        base, rot_dim=64, theta=1e7, axes="interleaved", sections=[11, 11, 10])
    assert cache_arguments(GLM41V, max_positions=7) == dict(
        base, rot_dim=64, theta=1e4, axes="sections", sections=[8, 12, 12])
    # the layout follows the model class: Qwen3-VL interleaves without the flag too,
    # and takes transformers' default sections when the config has none
    q3 = dict(QWEN3_VL["text_config"], rope_scaling={"rope_type": "default"})
    assert cache_arguments(q3, max_positions=7)["axes"] == "interleaved"
    assert cache_arguments(q3, max_positions=7)["sections"] == [24, 20, 20]
    # an unknown model with mrope_section: refused (the layout is the model
    # class's), unless the flag says interleaved
    other = dict(QWEN3, rope_scaling={"rope_type": "default", "mrope_section": [16, 24, 24]})
    with pytest.raises(ValueError, match="chosen per model class"):
        cache_arguments(other)
    other["rope_scaling"].update(mrope_interleaved=True, mrope_section=[24, 20, 20])
    assert cache_arguments(other)["axes"] == "interleaved"
    # sections that transformers' interleave does not fill exactly (its H
    # and W stop at pair 63 of 64): the same map, as axes="custom"
    other["rope_scaling"]["mrope_section"] = [16, 24, 24]
    a = cache_arguments(other)
    assert a["axes"] == "custom" and [a["pair_axis"].count(i) for i in range(3)] == [22, 21, 21]
    # Ernie-4.5-VL: sections given as [h, w, t], alternating H/W, then T
    ernie = dict(QWEN3, model_type="ernie4_5_vl_moe",
                 rope_scaling={"rope_type": "default", "mrope_section": [22, 22, 18]})
    assert cache_arguments(ernie)["axes"] == "alternating"
    assert cache_arguments(ernie)["sections"] == [18, 22, 22]
    # Gemma 4: global_head_dim for full attention; proportional keeps the whole head
    assert cache_arguments(GEMMA4, layer_type="full_attention", max_positions=7) == dict(
        type="proportional", rot_dim=512, max_positions=7, theta=1e6,
        partial_rotary_factor=0.25, factor=1.0)
    assert cache_arguments(GEMMA4, layer_type="sliding_attention", max_positions=7) == dict(
        base, rot_dim=256, theta=1e4)
    for name, cfg in (("qwen2-vl", QWEN2_VL), ("qwen3-vl", QWEN3_VL), ("qwen3.5", QWEN3_5),
                      ("glm-4.1v", GLM41V)):
        assert fusedrope.Cache.from_config(cfg, max_positions=16).params["axes"], name
    c = fusedrope.Cache.from_config(GEMMA4, layer_type="full_attention", max_positions=16)
    cos, sin = c.table()
    assert (sin[:, 64:] == 0).all() and (sin[1:, :64] != 0).all()   # 0.25 * 256 pairs rotate
    # LongRoPE: the regime follows seq_len
    # (without seq_len, max_positions = 64 <= 4096 decides: short)
    for seq_len, long in ((None, False), (4096, False), (4097, True)):
        a = cache_arguments(PHI3_LONGROPE, seq_len=seq_len, max_positions=64)
        assert a.get("seq_len") == seq_len
        inv, _ = _lib_inv(fusedrope.Cache(**a))
        f = np.asarray(PHI3_LONGROPE["rope_scaling"]["long_factor" if long else "short_factor"])
        np.testing.assert_allclose(inv, 10000.0 ** (-np.arange(48) / 48.0) / f, rtol=1e-6)


def test_mapping_unsupported():
    vision = dict(QWEN3, rope_scaling={"rope_type": "default", "axial": True})
    with pytest.raises(NotImplementedError, match="axial"):
        fusedrope.Cache.from_config(vision)
    with pytest.raises(NotImplementedError, match="ntk"):
        fusedrope.Cache.from_config(dict(QWEN3, rope_scaling={"rope_type": "ntk"}))
    nested = dict(QWEN3, rope_parameters={"full_attention": {"rope_type": "default"},
                                          "sliding_attention": {"rope_type": "default",
                                                                "rope_theta": 1e4}})
    with pytest.raises(NotImplementedError, match="layer_type"):
        fusedrope.Cache.from_config(nested)
    c = fusedrope.Cache.from_config(nested, layer_type="sliding_attention", max_positions=8)
    assert c.rot_dim == 128


def test_mapping_corners():
    """Corners of the mapping where a literal reading of the config would
    differ from transformers (a review's findings)."""
    # an odd int(head_dim * prf): ceil(F/2) pairs, exponents 2i/F
    odd = dict(QWEN3, head_dim=42, partial_rotary_factor=0.5)
    a = cache_arguments(odd)
    assert (a["rot_dim"], a["freq_dim"]) == (22, 21)
    inv, _ = _lib_inv(fusedrope.Cache(**dict(a, max_positions=4)))
    np.testing.assert_allclose(inv, 1e6 ** (-np.arange(0, 21, 2) / 21.0), rtol=1e-6)
    assert "freq_dim" not in cache_arguments(QWEN3)
    # a factor that rotates nothing is refused, for proportional too
    with pytest.raises(ValueError, match="rotates no channel"):
        cache_arguments(dict(QWEN3, partial_rotary_factor=0.0))
    g0 = dict(GEMMA4, rope_parameters=dict(GEMMA4["rope_parameters"], full_attention=dict(
        GEMMA4["rope_parameters"]["full_attention"], partial_rotary_factor=0.0)))
    with pytest.raises(ValueError, match="rotates no channel"):
        cache_arguments(g0, layer_type="full_attention")
    # per layer type: the layer's own original_max_position_embeddings first
    nested = dict(QWEN3, original_max_position_embeddings=4096, rope_parameters={
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                           "original_max_position_embeddings": 8192},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert cache_arguments(nested, layer_type="full_attention")["original_max_positions"] == 8192
    assert cache_arguments(PHI3_LONGROPE)["original_max_positions"] == 4096   # flat: top level
    # an incomplete config: a ValueError naming what is missing (not a
    # KeyError or a TypeError from int(None))
    for cfg, missing in (
            (dict(QWEN3, rope_scaling={"rope_type": "linear"}), "'factor'"),
            (dict(QWEN3, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "high_freq_factor": 4.0}), "'low_freq_factor'"),
            ({k: v for k, v in QWEN3.items() if k not in ("head_dim", "hidden_size")},
             "head_dim"),
            ({**{k: v for k, v in QWEN3.items() if k != "max_position_embeddings"},
              "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
             "max_position_embeddings")):
        with pytest.raises(ValueError, match=missing):
            cache_arguments(cfg, max_positions=64)
    # max_positions= is enough where the type does not need the context
    llama3 = {**{k: v for k, v in QWEN3.items() if k != "max_position_embeddings"},
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    assert cache_arguments(llama3, max_positions=64)["original_max_positions"] == 8192
    # an explicit attention factor of 0 (transformers: an all-zero table)
    z = dict(QWEN25_YARN, rope_scaling=dict(QWEN25_YARN["rope_scaling"], attention_factor=0.0))
    with pytest.raises(ValueError, match="attention_factor 0"):
        cache_arguments(z)
    # no rope_theta: the model class's default_theta (SmolLM3: 2e6), which
    # a dict config needs transformers to look up
    bare = {k: v for k, v in QWEN3.items() if k != "rope_theta"}
    bare["model_type"] = "smollm3"
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        with pytest.raises(ValueError, match="rope_theta"):
            cache_arguments(bare)
    else:
        assert CONFIG_MAPPING["smollm3"].default_theta == 2e6
        assert cache_arguments(bare)["theta"] == 2e6


# config.json dicts with the legacy names transformers' config classes
# translate on loading (public configs, abridged to the rope's fields)
GPTNEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
               "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048}
GPTJ_6B = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64,
           "n_positions": 2048}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "max_position_embeddings": 163840, "rope_theta": 10000,
               "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096}}
GEMMA3_FLAT = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8,
               "head_dim": 256, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
               "rope_local_base_freq": 10000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}}


def test_mapping_legacy_keys():
    """The names older config.json files use, mapped as transformers' config
    classes do (a review found GPT-NeoX at rot_dim 96, GPT-J at 256,
    DeepSeek-V3's dict at 56 and Gemma 3's local layers given the global
    rope)."""
    a = cache_arguments(GPTNEOX_20B)
    assert (a["rot_dim"], a["theta"], a["max_positions"]) == (24, 10000.0, 2048)
    a = cache_arguments({k: v for k, v in GPTNEOX_20B.items() if k != "rotary_pct"})
    assert a["rot_dim"] == 24          # GPTNeoXConfig's default rotary_pct, 0.25
    a = cache_arguments(GPTJ_6B)
    assert (a["rot_dim"], a["theta"], a["max_positions"]) == (64, 10000.0, 2048)
    assert "freq_dim" not in a
    a = cache_arguments(DEEPSEEK_V3)
    assert (a["rot_dim"], a["type"], a["factor"]) == (64, "yarn", 40.0)
    with pytest.raises(NotImplementedError, match="layer_type"):
        cache_arguments(GEMMA3_FLAT)
    a = cache_arguments(GEMMA3_FLAT, layer_type="sliding_attention")
    assert (a["type"], a["theta"], a["rot_dim"]) == ("default", 10000.0, 256)
    a = cache_arguments(GEMMA3_FLAT, layer_type="full_attention")
    assert (a["type"], a["theta"], a["factor"]) == ("linear", 1000000.0, 8.0)


def test_mapping_legacy_keys_against_transformers():
    """The same dicts through transformers' own config classes, which
    translate the names on loading: the same cache arguments."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    for cls, cfg, layer in ((transformers.GPTNeoXConfig, GPTNEOX_20B, None),
                            (transformers.GPTJConfig, GPTJ_6B, None),
                            (transformers.DeepseekV3Config, DEEPSEEK_V3, None),
                            (transformers.Gemma3TextConfig, GEMMA3_FLAT, "sliding_attention"),
                            (transformers.Gemma3TextConfig, GEMMA3_FLAT, "full_attention")):
        fields = {k: v for k, v in cfg.items() if k != "model_type"}
        obj = cls(**fields)
        want = cache_arguments(obj, layer_type=layer)
        got = cache_arguments(cfg, layer_type=layer)
        assert got == want, (cls.__name__, layer, got, want)


def test_odd_partial_dim_against_transformers():
    """transformers' GLM-4.5 default config (head_dim 42, partial 0.5: F = 21,
    11 pairs) through its own rotary class."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm4_moe import modeling_glm4_moe as m
    cfg = transformers.Glm4MoeConfig()
    rot = m.Glm4MoeRotaryEmbedding(cfg)
    pos = torch.arange(64)[None]
    cos_hf, sin_hf = rot(torch.zeros(1, dtype=torch.float32), pos)
    cache = fusedrope.Cache.from_config(cfg, max_positions=64)
    cos, sin = cache.table()
    half = cos_hf.shape[-1] // 2
    assert (cache.rot_dim, cos.shape[1]) == (2 * half, half) == (22, 11)
    np.testing.assert_allclose(cos, cos_hf[0, :, :half].double().numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(sin, sin_hf[0, :, :half].double().numpy(), rtol=0, atol=2e-6)


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
    ("gpt-oss", None, None), ("llama4-scout", None, None),
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


def test_cache_dropped_after_forward():
    """A Cache made inline and dropped after the forward still serves the
    backward: the autograd context holds it (the ops take its id)."""
    torch = pytest.importorskip("torch")
    import gc
    import fusedrope.torch as ft
    g = torch.Generator().manual_seed(ref.SEED)
    q = torch.randn(4, 1, 2, 8, generator=g, requires_grad=True)
    k = torch.randn(4, 1, 1, 8, generator=g, requires_grad=True)
    gq, gk = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    w = torch.randn(8, generator=g, requires_grad=True)
    calls = {
        "rope_qk": lambda c: ft.rope_qk(q, k, c),
        "rope": lambda c: (ft.rope(q, c), ft.rope(k, c)),
        "RopeQKFunction": lambda c: ft.RopeQKFunction.apply(q, k, c.id, "neox", "sbhd", False,
                                                            None, None, None, 1, 0),
        "norm_rope_qk": lambda c: ft.norm_rope_qk(q, k, w, w, c),
    }
    kept = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    for name, call in calls.items():
        leaves = (q, k, w) if name == "norm_rope_qk" else (q, k)
        want = torch.autograd.grad(call(kept), leaves, (gq, gk))
        qo, ko = call(fusedrope.Cache("default", rot_dim=8, max_positions=16))
        gc.collect()
        got = torch.autograd.grad((qo, ko), leaves, (gq, gk))
        for a, b in zip(got, want):
            assert torch.equal(a, b), name


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


def test_gemma_config_json_class_defaults():
    """A Gemma 3 or 4 config.json that leaves its rope to the model class's
    defaults gives the caches transformers' config object gives: Gemma 3
    without rope_theta (the class's {"global": 1e6, "local": 1e4}; it raised
    TypeError), Gemma 4 without rope_parameters (proportional, 1e6, a quarter
    of the pairs; it gave a plain default cache), and Gemma 4's
    full-attention head_dim from the top-level config object and from a
    saved config.json's per_layer_config (both gave the sliding head_dim)."""
    transformers = pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING
    g3 = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8,
          "head_dim": 256, "num_hidden_layers": 34, "max_position_embeddings": 131072,
          "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    g4 = {"model_type": "gemma4_text", "hidden_size": 1536, "num_attention_heads": 8,
          "head_dim": 256, "global_head_dim": 512, "num_hidden_layers": 6,
          "max_position_embeddings": 131072}
    for d in (g3, g4):
        obj = CONFIG_MAPPING[d["model_type"]](**{k: v for k, v in d.items() if k != "model_type"})
        for lt in ("full_attention", "sliding_attention"):
            a = fusedrope.Cache.from_config(d, max_positions=64, layer_type=lt)
            b = fusedrope.Cache.from_config(obj, max_positions=64, layer_type=lt)
            assert (a.type, a.params, a.rot_dim) == (b.type, b.params, b.rot_dim), (d, lt)
            assert np.array_equal(a.table()[0], b.table()[0])
    full = fusedrope.Cache.from_config(g3, max_positions=64, layer_type="full_attention")
    assert full.params == {"theta": 1e6, "factor": 8.0}
    full = fusedrope.Cache.from_config(g4, max_positions=64, layer_type="full_attention")
    assert full.type == "proportional" and full.rot_dim == 512
    tc = transformers.Gemma4TextConfig(hidden_size=256, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=64, global_head_dim=128,
                                       num_hidden_layers=6, max_position_embeddings=4096)
    top = transformers.Gemma4Config(text_config=tc.to_dict())
    saved = dict(tc.to_dict(), model_type="gemma4_text")
    for conf in (tc, top, saved):
        assert fusedrope.Cache.from_config(conf, max_positions=64,
                                           layer_type="full_attention").rot_dim == 128


def test_gemma4_config_json_without_transformers(monkeypatch):
    """Without transformers, a Gemma 4 config.json without rope_parameters is
    refused (its per-layer defaults are the model class's), not read as a
    plain default rope."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    g4 = {"model_type": "gemma4_text", "hidden_size": 1536, "num_attention_heads": 8,
          "head_dim": 256, "num_hidden_layers": 6, "max_position_embeddings": 131072}
    with pytest.raises(ValueError, match="rope_parameters"):
        fusedrope.Cache.from_config(g4, max_positions=64, layer_type="full_attention")
    g4["rope_parameters"] = {"full_attention": {"rope_type": "proportional",
                                                "partial_rotary_factor": 0.25,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    c = fusedrope.Cache.from_config(g4, max_positions=64, layer_type="full_attention")
    assert c.type == "proportional"


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
    # a tensor with no memory (device "meta"): ValueError, as the README says
    # of bad arguments (a bare BufferError before)
    with pytest.raises(ValueError, match="DLPack"):
        fusedrope.forward(cache, torch.empty(4, 2, 3, 8, device="meta"))


def test_inplace_moves_version():
    """A call writes PyTorch tensors as PyTorch's own in-place and out=
    operations do: their version counters move, so autograd refuses a graph
    that saved the old values (x saved for w's gradient, then rotated in
    place), as it refuses x.mul_(1.0); before, backward ran and w.grad was
    wrong.  The forward's and backward's other outputs (rstd, dweight) too."""
    torch = pytest.importorskip("torch")
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    for call in ("forward", "backward", "forward_qk"):
        x = torch.randn(4, 2, 3, 8)
        w = torch.randn(8, requires_grad=True)
        y = (x * w).sum()
        v0 = x._version
        if call == "forward_qk":
            fusedrope.forward_qk(cache, x, torch.randn(4, 2, 1, 8))
        else:
            getattr(fusedrope, call)(cache, x)
        assert x._version > v0, call
        with pytest.raises(RuntimeError, match="inplace"):
            y.backward()
    q, k = torch.randn(5, 1, 4, 8), torch.randn(5, 1, 2, 8)
    qw, kw = torch.rand(8) + 0.5, torch.rand(8) + 0.5
    rq, rk = torch.empty(5, 1, 4), torch.empty(5, 1, 2)  # bshd: [batch, seq, heads]
    out = (torch.empty_like(q), torch.empty_like(k))
    before = [t._version for t in (q, k) + out + (rq, rk)]
    fusedrope.norm_forward_qk(cache, q, k, qw, kw, rstd=(rq, rk), out=out, layout="bshd")
    after = [t._version for t in (q, k) + out + (rq, rk)]
    assert after[:2] == before[:2] and all(a > b for a, b in zip(after[2:], before[2:]))
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    dw = (torch.empty(8), torch.empty(8))
    before = [t._version for t in (dq, dk) + dw]
    fusedrope.norm_backward_qk(cache, q, dq, k, dk, qw, kw, rstd=(rq, rk), dweight=dw,
                               layout="bshd")
    assert all(t._version > b for t, b in zip((dq, dk) + dw, before))


def test_torch_tensors_direct():
    """Plain tensors go through to_dlpack (fusedrope._torch_direct), the
    rest through tensor.__dlpack__: the same bytes either way, strided views
    included, and what __dlpack__ refuses (a tensor requiring gradient) is
    still refused."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):  # a subclass: __dlpack__, not to_dlpack
        pass

    cache = fusedrope.Cache("default", rot_dim=16, max_positions=32)
    g = torch.Generator().manual_seed(ref.salt("torch direct"))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        base = torch.randn(7, 2, 6, 16, generator=g).to(dtype)
        for x in (base, base[:, :, ::2], base.transpose(0, 1)):  # sbhd, heads and seq strided
            assert fusedrope._torch_direct(x, False)
            assert not fusedrope._torch_direct(x.as_subclass(Sub), False)
            y = torch.full_like(x, float("nan"))
            ys = torch.full_like(x, float("nan")).as_subclass(Sub)
            fusedrope.forward(cache, x, out=y)
            fusedrope.forward(cache, x.as_subclass(Sub), out=ys)
            assert torch.equal(y.view(torch.int16), ys.as_subclass(torch.Tensor).view(torch.int16))
            z = fusedrope.backward(cache, y.clone())
            assert torch.allclose(z.float(), x.float(), rtol=0, atol=0.05)
    x = torch.randn(4, 1, 2, 16, requires_grad=True)
    assert not fusedrope._torch_direct(x, False)
    with pytest.raises(ValueError, match="DLPack"):
        fusedrope.forward(cache, x, out=torch.empty(4, 1, 2, 16))
    q, k = torch.randn(5, 1, 4, 16), torch.randn(5, 1, 2, 16)
    w = torch.nn.Parameter(torch.rand(16) + 0.5, requires_grad=False)  # a subclass
    qo, ko = fusedrope.norm_forward_qk(cache, q, k, w, w.detach(), rounding="once",
                                       out=(torch.empty_like(q), torch.empty_like(k)))
    qs, ks = fusedrope.norm_forward_qk(cache, q.as_subclass(Sub), k.as_subclass(Sub), w, w,
                                       rounding="once",
                                       out=(torch.empty_like(q), torch.empty_like(k)))
    assert not torch.equal(qo, q)
    assert torch.equal(qo, qs.as_subclass(torch.Tensor))
    assert torch.equal(ko, ks.as_subclass(torch.Tensor))


# ------------------------------------- multimodal rope against transformers

def _qwen_vl(kind):
    """(text config, rotary embedding, apply_rotary_pos_emb) of transformers'
    Qwen2-VL or Qwen3-VL, built small (head_dim 64: 32 pairs)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if kind == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig as C
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VLRotaryEmbedding as R, apply_rotary_pos_emb as apply)
        rp = {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1e6}
    else:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as C
        from transformers.models.qwen3_vl.modeling_qwen3_vl import (
            Qwen3VLTextRotaryEmbedding as R, apply_rotary_pos_emb as apply)
        rp = {"rope_type": "default", "mrope_section": [12, 10, 10], "mrope_interleaved": True,
              "rope_theta": 5e6}
    cfg = C(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=4096, rope_parameters=rp)
    return cfg, R(cfg), apply


def _recomposed64(rotary, inv64, pos):
    """cos and sin [b, s, rot_dim] in a multimodal rotary class's own layout
    (its recomposition_frequencies) of the float64 angles pos x inv64, for
    [3, b, s] position ids."""
    freqs = pos[..., None].double() * inv64                   # [3, b, s, rot_dim/2]
    return (rotary.recomposition_frequencies(freqs.cos()),
            rotary.recomposition_frequencies(freqs.sin()))


def _vl_positions(g, b, s, torch):
    """[3, b, s] position ids as a Qwen-VL prompt has them: text (all axes
    equal), then an image grid (t fixed, h and w walking the grid), then
    text again from the largest position on; plus a random batch entry."""
    rows = []
    for n in range(b):
        t = torch.empty(3, s, dtype=torch.int64)
        a, grid = 5 + 3 * n, 4
        t[:, :a] = torch.arange(a)
        img = s - a - 6
        k = torch.arange(img)
        t[0, a:a + img] = a
        t[1, a:a + img] = a + k // grid
        t[2, a:a + img] = a + k % grid
        nxt = int(t[:, :a + img].max()) + 1
        t[:, a + img:] = nxt + torch.arange(s - a - img)
        rows.append(t)
    rows[-1] = torch.randint(0, 4000, (3, s), generator=g)
    return torch.stack(rows, 1)


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen3_vl"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_multimodal_rope_against_transformers(kind, dtype):
    """Cache.from_config(the transformers config) + forward_qk with [3, b, s]
    position ids, against (a) transformers' own layout code (the rotary
    class's recomposition_frequencies and apply_rotary_pos_emb) evaluated in
    float64: within the library's bound; (b) transformers' float32 forward
    (rotary class + apply): within bfloat16 tolerance."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    cfg, rotary, apply = _qwen_vl(kind)
    cache = fusedrope.Cache.from_config(cfg)
    assert cache.params["axes"] == ("sections" if kind == "qwen2_vl" else "interleaved")
    b, s, hq, hk, d = 3, 29, 4, 2, 64
    g = torch.Generator().manual_seed(ref.SEED)
    tdt = getattr(torch, dtype)
    q = (torch.randn(b, s, hq, d, generator=g) * 3).to(tdt)
    k = (torch.randn(b, s, hk, d, generator=g) * 3).to(tdt)
    pos = _vl_positions(g, b, s, torch)
    qo, ko = fusedrope.forward_qk(cache, q, k, layout="bshd", ids=pos,
                                  out=(torch.empty_like(q), torch.empty_like(k)))

    # (a) float64: transformers' recomposition on float64 angles
    theta = cfg.rope_parameters["rope_theta"]
    inv64 = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos64, sin64 = _recomposed64(rotary, inv64, pos)
    rq, rk = apply(q.double().transpose(1, 2), k.double().transpose(1, 2), cos64, sin64)
    # (b) transformers' own float32 path
    cos32, sin32 = rotary(q.float(), pos)
    hq32, hk32 = apply(q.float().transpose(1, 2), k.float().transpose(1, 2), cos32, sin32)
    half = d // 2
    for got, want, hf, src in ((qo, rq, hq32, q), (ko, rk, hk32, k)):
        x = src.double().numpy()
        mag = np.abs(x[..., :half]) + np.abs(x[..., half:])
        mag = np.concatenate([mag, mag], -1)
        g64 = got.double().numpy()
        ref.assert_close(g64, want.transpose(1, 2).numpy(), mag, dtype, what=f"{kind} float64")
        err = np.abs(g64 - hf.transpose(1, 2).double().numpy())
        assert (err <= 2.0 ** -8 * mag + 1e-6).all(), (kind, float(err.max()))


# transformers' multimodal text models: (module, text config class, rotary
# class, head_dim, partial_rotary_factor, theta, style); head_dim is sized so
# that the class's default mrope_section covers the rotated pairs.
_MM_FAMILIES = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding", 128, 1.0, 1e6, "neox"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding", 128, 1.0,
                   1e6, "neox"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding", 128, 1.0, 5e6,
                 "neox"),
    "qwen3_5": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5TextRotaryEmbedding", 256, 0.25, 1e7,
                "neox"),
    "glm4v": ("glm4v", "Glm4vTextConfig", "Glm4vTextRotaryEmbedding", 128, 0.5, 1e4,
              "interleaved"),
    "glm4v_moe": ("glm4v_moe", "Glm4vMoeTextConfig", "Glm4vMoeTextRotaryEmbedding", 128, 0.5,
                  1e4, "neox"),
    "glm_ocr": ("glm_ocr", "GlmOcrTextConfig", "GlmOcrTextRotaryEmbedding", 128, 0.5, 1e4,
                "interleaved"),
    "glm_image": ("glm_image", "GlmImageTextConfig", "GlmImageTextRotaryEmbedding", 128, 0.5,
                  1e4, "neox"),
}


@pytest.mark.parametrize("family", sorted(_MM_FAMILIES))
def test_multimodal_families_against_transformers(family):
    """Cache.from_config of each multimodal text config (no mrope_section:
    the model class's default) with [3, b, s] ids, forward_qk and
    backward_qk in bfloat16, against the model's own recomposition and
    apply_rotary_pos_emb evaluated in float64 (backward: its transpose, by
    autograd); channels past rot_dim pass through."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib
    mod, cname, rname, d, prf, theta, style = _MM_FAMILIES[family]
    cm = importlib.import_module(f"transformers.models.{mod}.configuration_{mod}")
    mm = importlib.import_module(f"transformers.models.{mod}.modeling_{mod}")
    rp = {"rope_type": "default", "rope_theta": theta}
    if prf != 1.0:
        rp["partial_rotary_factor"] = prf
    cfg = getattr(cm, cname)(hidden_size=4 * d, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=d, max_position_embeddings=4096, rope_parameters=rp)
    rotary = getattr(mm, rname)(cfg)
    cache = fusedrope.Cache.from_config(cfg)
    rot = cache.rot_dim
    assert rot == int(d * prf)
    b, s, hq, hk = 2, 29, 4, 2
    g = torch.Generator().manual_seed(ref.SEED)
    pos = _vl_positions(g, b, s, torch)
    q = (torch.randn(b, s, hq, d, generator=g) * 3).to(torch.bfloat16)
    k = (torch.randn(b, s, hk, d, generator=g) * 3).to(torch.bfloat16)
    inv64 = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    cos64, sin64 = _recomposed64(rotary, inv64, pos)

    def model(x):                        # [b, s, h, d] -> the model's rotation
        y, _ = mm.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos64, sin64)
        return y.transpose(1, 2)

    a = torch.arange(rot // 2) if style == "neox" else torch.arange(0, rot, 2)
    bb = a + rot // 2 if style == "neox" else a + 1
    for backward in (False, True):
        fn = fusedrope.backward_qk if backward else fusedrope.forward_qk
        qo, ko = fn(cache, q, k, style=style, layout="bshd", ids=pos,
                    out=(torch.empty_like(q), torch.empty_like(k)))
        for got, src in ((qo, q), (ko, k)):
            x = src.double()
            if backward:
                xin = torch.zeros_like(x, requires_grad=True)
                (want,) = torch.autograd.grad(model(xin), xin, grad_outputs=x)
            else:
                want = model(x)
            mag = torch.zeros_like(x)
            mag[..., a] = mag[..., bb] = x[..., a].abs() + x[..., bb].abs()
            ref.assert_close(got.double().numpy(), want.numpy(), mag.numpy(), "bfloat16",
                             what=f"{family} {'backward' if backward else 'forward'}")


def test_multimodal_mapping_of_other_families():
    """The multimodal models whose rotary class this file does not run:
    their axes and transformers' default sections; HunYuan-VL refused."""
    base = dict(QWEN3, rope_scaling={"rope_type": "default"})
    for model_type, axes, sections in (("paddleocr_vl_text", "sections", [16, 24, 24]),
                                       ("qwen2_5_omni_text", "sections", [16, 24, 24]),
                                       ("qwen3_omni_moe_text", "interleaved", [24, 20, 20]),
                                       ("glm_ocr_text", "sections", [8, 12, 12]),
                                       ("glm_image_text", "sections", [8, 12, 12])):
        a = cache_arguments(dict(base, model_type=model_type))
        assert (a["axes"], a["sections"]) == (axes, sections), model_type
    # Qwen3-Omni interleaves without the config's flag
    q3o = dict(base, model_type="qwen3_omni_moe_text",
               rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20]})
    assert cache_arguments(q3o)["axes"] == "interleaved"
    hy = dict(base, model_type="hunyuan_vl_text",
              rope_scaling={"rope_type": "default", "mrope_section": [16, 16, 16, 16]})
    with pytest.raises(NotImplementedError, match="not a rotation per pair"):
        cache_arguments(hy)


def test_multimodal_text_only_positions_match_1d():
    """Qwen2-VL's text-only path expands position_ids to [3, b, s]: the
    broadcast view gives the library's 1D rope, as transformers gives
    its default rope."""
    torch = pytest.importorskip("torch")
    cfg, rotary, apply = _qwen_vl("qwen2_vl")
    cache = fusedrope.Cache.from_config(cfg)
    q = torch.randn(2, 7, 4, 64)
    pos = torch.arange(7).repeat(2, 1)                    # [b, s], contiguous
    a = fusedrope.forward(cache, q, layout="bshd", ids=pos[None].expand(3, 2, 7),
                          out=torch.empty_like(q))
    plain = fusedrope.Cache("default", rot_dim=64, max_positions=4096, theta=1e6)
    b_ = fusedrope.forward(plain, q, layout="bshd", ids=pos, out=torch.empty_like(q))
    assert torch.equal(a, b_)
    # transformers' own form, arange(s).view(1, 1, -1).expand(3, b, -1): a
    # batch stride of 0 (copied compact), through the torch op too
    hf_pos = torch.arange(7).view(1, 1, -1).expand(3, 2, -1)
    assert hf_pos.stride()[:2] == (0, 0)
    c = fusedrope.forward(cache, q, layout="bshd", ids=hf_pos, out=torch.empty_like(q))
    assert torch.equal(c, b_)
    from fusedrope.torch import rope
    assert torch.equal(rope(q, cache, layout="bshd", ids=hf_pos), b_)


def test_gemma4_proportional_against_transformers():
    """Gemma 4's full-attention inv_freq from transformers' own rotary class
    (ROPE_INIT_FUNCTIONS["proportional"] on the layer type's config), and
    the sliding layers' default one, against the library's tables."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if "proportional" not in ROPE_INIT_FUNCTIONS:
        pytest.skip("this transformers has no proportional rope")
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
    for prf, factor in ((0.25, None), (0.5, 8.0)):
        rp = {k: dict(v) for k, v in GEMMA4["rope_parameters"].items()}
        rp["full_attention"]["partial_rotary_factor"] = prf
        if factor:
            rp["full_attention"]["factor"] = factor
        hf = transformers.Gemma4TextConfig(num_hidden_layers=6, hidden_size=2560,
                                           num_attention_heads=8, num_key_value_heads=2,
                                           head_dim=256, global_head_dim=512,
                                           rope_parameters=rp)
        rotary = Gemma4TextRotaryEmbedding(hf)
        for lt in ("full_attention", "sliding_attention"):
            want = getattr(rotary, f"{lt}_inv_freq").double().numpy()
            for config in (hf, dict(GEMMA4, rope_parameters=rp)):
                cache = fusedrope.Cache.from_config(config, layer_type=lt, max_positions=4)
                inv, att = _lib_inv(cache)
                assert inv.shape == want.shape, (lt, inv.shape, want.shape)
                np.testing.assert_allclose(inv, want, rtol=5e-6, atol=0)
                assert att == getattr(rotary, f"{lt}_attention_scaling") == 1.0


def test_longrope_regime_against_transformers_dynamic_update():
    """Phi-3's rotary class switches short/long factors per call on
    max(position_ids) + 1; from_config(seq_len=...) builds the same regime."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    hf_config = _hf("phi3-longrope")
    rotary = Phi3RotaryEmbedding(hf_config)
    x = torch.zeros(1)
    for seq_len in (4096, 4097, 1, 131072):
        rotary(x, torch.tensor([[seq_len - 1]]))
        want = rotary.inv_freq.double().numpy()
        cache = fusedrope.Cache.from_config(hf_config, max_positions=64, seq_len=seq_len)
        inv, att = _lib_inv(cache)
        np.testing.assert_allclose(inv, want, rtol=5e-6, atol=0)
        assert math.isclose(att, rotary.attention_scaling, rel_tol=2e-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ernie_multimodal_rope_against_transformers(dtype):
    """Ernie-4.5-VL: Cache.from_config + forward_qk (GPT-J pairs) with
    [3, b, s] position ids against transformers' rotary class (its
    pre-permuted frequencies and recomposition_frequencies) and its
    apply_rotary_pos_emb: in float64 within the library's bound, and its own
    float32 path within bfloat16 tolerance."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as m
    from transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeTextConfig as C)
    sec = [12, 12, 8]  # [h, w, t] over 32 pairs (head_dim 64)
    cfg = C(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": sec})
    rotary = m.Ernie4_5_VLMoeTextRotaryEmbedding(cfg)
    cache = fusedrope.Cache.from_config(cfg)
    assert cache.params["axes"] == "alternating"
    b, s, hq, hk, d = 2, 23, 4, 2, 64
    g = torch.Generator().manual_seed(ref.SEED)
    tdt = getattr(torch, dtype)
    q = (torch.randn(b, s, hq, d, generator=g) * 3).to(tdt)
    k = (torch.randn(b, s, hk, d, generator=g) * 3).to(tdt)
    pos = _vl_positions(g, b, s, torch)
    qo, ko = fusedrope.forward_qk(cache, q, k, layout="bshd", ids=pos, style="interleaved",
                                  out=(torch.empty_like(q), torch.empty_like(k)))
    # (a) float64: transformers' pre-permutation and recomposition on float64 angles
    inv64 = 5e5 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    t = sec[2]
    inv3d = torch.cat([inv64[:-t][0::2], inv64[:-t][1::2], inv64[-t:]])
    cos64, sin64 = _recomposed64(rotary, inv3d, pos)
    rq, rk = m.apply_rotary_pos_emb(q.double().transpose(1, 2), k.double().transpose(1, 2),
                                    cos64, sin64)
    # (b) transformers' own float32 path
    cos32, sin32 = rotary(q.float(), pos)
    hq32, hk32 = m.apply_rotary_pos_emb(q.float().transpose(1, 2), k.float().transpose(1, 2),
                                        cos32, sin32)
    for got, want, hf, src in ((qo, rq, hq32, q), (ko, rk, hk32, k)):
        x = src.double().numpy()
        mag = np.abs(x[..., 0::2]) + np.abs(x[..., 1::2])
        mag = np.repeat(mag, 2, -1)
        g64 = got.double().numpy()
        ref.assert_close(g64, want.transpose(1, 2).double().numpy(), mag, dtype,
                         what="ernie float64")
        err = np.abs(g64 - hf.transpose(1, 2).double().numpy())
        assert (err <= 2.0 ** -8 * mag + 1e-6).all(), float(err.max())



# --- transformers 5.24 model types a review found mapped wrongly or not refused


def _default_config(model_type):
    """transformers' default config of model_type and its modeling module,
    or a skip where this transformers lacks the model."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import importlib
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers ({transformers.__version__}) has no {model_type}")
    mod = model_type_to_module_name(model_type)
    return CONFIG_MAPPING[model_type](), importlib.import_module(
        f"transformers.models.{mod}.modeling_{mod}")


def _model_rotation(m, rotary, q, pos, **kw):
    """q [b, h, s, d] rotated by the model's own rotary class and apply."""
    cos, sin = rotary(q, pos, **kw)
    return m.apply_rotary_pos_emb(q, q, cos, sin)[0]


def _lib_rotation(cache, q, pos, style):
    """The same through the library: q [b, h, s, d], ids [axes, b, s]."""
    x = q.transpose(1, 2).contiguous()
    fusedrope.forward(cache, x, style=style, layout="bshd", ids=pos.numpy().astype(np.int64))
    return x.transpose(1, 2)


# model_type -> (rotary class, axes, style, layer types)
_MM_524 = {
    "cosmos3_edge": ("Cosmos3EdgeTextRotaryEmbedding", 3, "neox", (None,)),
    "hy_v4_vl": ("HYV4VLRotaryEmbedding", 3, "interleaved", (None,)),
    "qwen4_exp": ("Qwen4ExpTextRotaryEmbedding", 3, "neox", (None,)),
    "neomme": ("NeoMMERotaryEmbedding", 2, "neox", ("full_attention", "sliding_attention")),
}


@pytest.mark.parametrize("model_type", sorted(_MM_524))
def test_multimodal_models_of_transformers_5_24(model_type):
    """Cosmos3-Edge and HY-V4-VL (mrope_section in the config, T/H/W
    interleaved as Qwen3-VL: were given axes "sections"), Qwen4-Exp and
    NeoMME (no mrope_section; the class's default layout, NeoMME's a
    row/column interleave on two axes: were given a 1-D cache): from_config
    of the top-level default config against the model's own rotary class
    and apply_rotary_pos_emb, with an image's positions per axis."""
    cfg, m = _default_config(model_type)
    import torch
    rname, naxes, style, layer_types = _MM_524[model_type]
    text = cfg.get_text_config()
    d = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rotary = getattr(m, rname)(text)
    g = torch.Generator().manual_seed(ref.SEED)
    s = 24
    pos = torch.cat([torch.arange(s)[None], torch.randint(0, 40, (naxes - 1, s), generator=g)])
    pos = pos[:, None, :]                                   # [axes, 1, s]
    q = torch.randn(1, 2, s, d, generator=g)
    for lt in layer_types:
        kw = {} if lt is None else {"layer_type": lt}
        want = _model_rotation(m, rotary, q, pos, **kw)
        cache = fusedrope.Cache.from_config(cfg, max_positions=64, layer_type=lt)
        got = _lib_rotation(cache, q, pos, style)
        err = float((got - want).abs().max())
        assert err < 2e-5, (model_type, lt, err, cache.params)


def test_unknown_multimodal_model_refused():
    """A model type this mapping does not know, with an mrope_section: the
    layout (and style) are the model class's, so a ValueError that says so
    and how to build the cache, not a guessed "sections" (which was silently
    wrong for Cosmos3-Edge and HY-V4-VL); `mrope_interleaved: true` still
    maps to "interleaved"."""
    import importlib
    cfg = {"model_type": "some_future_vl_text", "hidden_size": 512, "num_attention_heads": 4,
           "max_position_embeddings": 4096,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                               "mrope_section": [24, 20, 20]}}
    with pytest.raises(ValueError, match="chosen per model class.*axes="):
        fusedrope.Cache.from_config(cfg)
    cfg["rope_parameters"]["mrope_interleaved"] = True
    c = fusedrope.Cache.from_config(cfg)
    assert (c.params["axes"], c.params["sections"]) == ("interleaved", [24, 20, 20])
    # and the refused one, built as the message says, is the interleaved
    # model's rotation (Cosmos3-Edge's class)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    try:
        m = importlib.import_module("transformers.models.cosmos3_edge.modeling_cosmos3_edge")
        from transformers import CONFIG_MAPPING
        text = CONFIG_MAPPING["cosmos3_edge_text"](
            hidden_size=512, num_attention_heads=4, head_dim=128, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                             "mrope_section": [24, 20, 20]})
    except (ImportError, KeyError):
        pytest.skip("this transformers has no Cosmos3-Edge")
    rotary = m.Cosmos3EdgeTextRotaryEmbedding(text)
    g = torch.Generator().manual_seed(ref.SEED)
    pos = torch.cat([torch.arange(16)[None], torch.randint(0, 40, (2, 16), generator=g)])[:, None]
    q = torch.randn(1, 2, 16, 128, generator=g)
    want = _model_rotation(m, rotary, q, pos)
    got = _lib_rotation(fusedrope.Cache.from_config(dict(cfg, model_type="cosmos3_edge_text")),
                        q, pos, "neox")
    assert float((got - want).abs().max()) < 2e-5


def test_rotary_dim_only_where_transformers_reads_it():
    """MiniMax-M3-VL's text config has rotary_dim=64, which its code never
    reads (it rotates all 128 channels; was rot_dim 64); GPT-J, CodeGen and
    MiniMax-M2 (whose config class turns it into partial_rotary_factor)
    keep it."""
    cfg, m = _default_config("minimax_m3_vl")
    import torch
    text = cfg.get_text_config()
    assert text.rotary_dim == 64 and text.head_dim == 128
    rotary = m.MiniMaxM3VLRotaryEmbedding(text)
    g = torch.Generator().manual_seed(ref.SEED)
    pos = torch.arange(64).view(1, -1)
    q = torch.randn(1, 2, 64, 128, generator=g)
    want = _model_rotation(m, rotary, q, pos)
    for config in (cfg, text, dict(text.to_dict(), model_type="minimax_m3_vl_text")):
        cache = fusedrope.Cache.from_config(config, max_positions=64)
        assert cache.rot_dim == 128
        got = _lib_rotation(cache, q, pos, "neox")
        assert float((got - want).abs().max()) < 2e-5
    m2 = {"model_type": "minimax_m2", "hidden_size": 3072, "num_attention_heads": 48,
          "head_dim": 128, "rotary_dim": 64, "max_position_embeddings": 4096,
          "rope_theta": 5e6}
    from transformers import CONFIG_MAPPING
    obj = CONFIG_MAPPING["minimax_m2"](**{k: v for k, v in m2.items() if k != "model_type"})
    assert cache_arguments(m2)["rot_dim"] == cache_arguments(obj)["rot_dim"] == 64
    assert cache_arguments(GPTJ_6B)["rot_dim"] == 64
    assert cache_arguments({k: v for k, v in GPTJ_6B.items() if k != "rotary_dim"})[
        "rot_dim"] == 64           # GPTJConfig's default


def test_nanochat_refused_and_negated_table():
    """NanoChat's rotate_half is cat(x2, -x1): a rotation by minus the angle
    (was accepted as a plain NeoX rope).  Refused with the way to get it,
    a table whose sin is negated, which matches the model."""
    cfg, m = _default_config("nanochat")
    import torch
    with pytest.raises(NotImplementedError, match=r"minus the angle.*from_table\(cos, -sin\)"):
        fusedrope.Cache.from_config(cfg, max_positions=64)
    d = cfg.hidden_size // cfg.num_attention_heads
    rotary = m.NanoChatRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(ref.SEED)
    pos = torch.arange(64).view(1, -1)
    q = torch.randn(1, 2, 64, d, generator=g)
    want = _model_rotation(m, rotary, q, pos)
    cos, sin = fusedrope.Cache("default", rot_dim=d, max_positions=64,
                               theta=cfg.rope_parameters["rope_theta"]).table()
    got = _lib_rotation(fusedrope.Cache.from_table(cos, -sin), q, pos, "neox")
    assert float((got - want).abs().max()) < 2e-5


def test_per_layer_type_yarn_truncate_as_transformers():
    """transformers' yarn reads `truncate` from config.rope_parameters, the
    per-layer-type dict, where it is absent: a layer's own truncate: false
    is not applied (it was), and the library follows."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
    rp = {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
                             "truncate": False, "original_max_position_embeddings": 4096},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    hf = transformers.Gemma3TextConfig(rope_parameters=rp, max_position_embeddings=32768)
    rotary = Gemma3RotaryEmbedding(hf)
    want = rotary.full_attention_inv_freq.double().numpy()
    for config in (hf, {"model_type": "gemma3_text", "hidden_size": hf.hidden_size,
                        "num_attention_heads": hf.num_attention_heads, "head_dim": hf.head_dim,
                        "max_position_embeddings": 32768, "rope_parameters": rp}):
        a = cache_arguments(config, layer_type="full_attention", max_positions=4)
        assert a["truncate"] is True
        inv, att = _lib_inv(fusedrope.Cache(**a))
        np.testing.assert_allclose(inv, want, rtol=5e-6, atol=0)
        assert math.isclose(att, rotary.full_attention_attention_scaling, rel_tol=2e-7)


@pytest.mark.parametrize("model_type", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_omni_top_level_config_against_thinker(model_type):
    """Composite configs whose language model is not at .text_config
    (Qwen2.5-Omni's and Qwen3-Omni's thinker; were refused for want of
    head_dim): from_config takes transformers' get_text_config(), and
    matches the thinker's own rotary class with T/H/W positions."""
    cfg, m = _default_config(model_type)
    import torch
    text = cfg.get_text_config()
    rp = dict(text.rope_parameters)
    if model_type == "qwen3_omni_moe":
        # sized so that the default sections cover the pairs
        text.head_dim, rp["mrope_section"], rp["mrope_interleaved"] = 128, [24, 20, 20], True
        text.rope_parameters = rp
    rname = ("Qwen2_5OmniRotaryEmbedding" if model_type == "qwen2_5_omni"
             else "Qwen3OmniMoeThinkerTextRotaryEmbedding")
    rotary = getattr(m, rname)(text)
    d = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = fusedrope.Cache.from_config(cfg, max_positions=64)
    assert cache.params == fusedrope.Cache.from_config(text, max_positions=64).params
    assert cache.params["axes"] in ("sections", "interleaved")
    g = torch.Generator().manual_seed(ref.SEED)
    pos = torch.cat([torch.arange(20)[None], torch.randint(0, 40, (2, 20), generator=g)])[:, None]
    q = torch.randn(1, 2, 20, d, generator=g)
    want = _model_rotation(m, rotary, q, pos)
    got = _lib_rotation(cache, q, pos, "neox")
    assert float((got - want).abs().max()) < 2e-5


def test_composite_configs_use_get_text_config():
    """ColQwen2 (vlm_config), T5Gemma (encoder/decoder): the language
    model's config as transformers' get_text_config() gives it."""
    _default_config("llama")
    from transformers import CONFIG_MAPPING
    for model_type in ("colqwen2", "t5gemma"):
        if model_type not in CONFIG_MAPPING:
            continue
        cfg = CONFIG_MAPPING[model_type]()
        assert cache_arguments(cfg, max_positions=8) == cache_arguments(
            cfg.get_text_config(), max_positions=8), model_type


def test_configs_without_rope_refused():
    """GPT-2, BERT and SAM 3's CLIP text encoder have no rotary embedding:
    refused (they were given a default 10000 cache); a config.json dict
    with no rope key is judged by its config class (an older Llama
    config.json without rope_theta still maps)."""
    _default_config("llama")
    from transformers import CONFIG_MAPPING
    for model_type in ("gpt2", "bert", "sam3"):
        if model_type not in CONFIG_MAPPING:
            continue
        with pytest.raises(ValueError, match="no RoPE setting"):
            fusedrope.Cache.from_config(CONFIG_MAPPING[model_type](), max_positions=8)
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_positions": 1024}
    with pytest.raises(ValueError, match="no RoPE setting"):
        cache_arguments(gpt2)
    llama1 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
              "max_position_embeddings": 2048}
    assert cache_arguments(llama1)["theta"] == 10000.0
