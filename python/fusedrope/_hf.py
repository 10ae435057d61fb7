"""Hugging Face model configs -> fusedrope.Cache arguments.

Mirrors transformers' modeling_rope_utils (checked against transformers
5.23.0 and 5.24.0; the older rope_scaling layout of 4.x is read too):

- the language model's config: a config object's get_text_config() when
  its top level has no num_attention_heads (text_config; Qwen2.5-Omni's and
  Qwen3-Omni's thinker text config; ColQwen2's, T5Gemma's, ...), else its
  text_config; a dict's "text_config", else "thinker_config"'s;
- a config with no RoPE setting at all (no rope_parameters, rope_scaling,
  rope_theta, rotary_dim, rotary_pct, rotary_emb_base,
  partial_rotary_factor, qk_rope_head_dim, rope_local_base_freq: GPT-2,
  BERT, SAM 3's CLIP text encoder) is refused (ValueError); a config.json
  dict with none is judged by its transformers config class where
  installed (an older Llama config.json without rope_theta maps);
- rope parameters: ``rope_parameters`` (transformers >= 4.57/5), else
  ``rope_scaling`` (older); rope_type from "rope_type", else the legacy
  "type" ("su" is LongRoPE's old name); ``rope_theta`` and
  ``partial_rotary_factor`` from the dict, else from the config's top level;
- rot_dim = int(head_dim * partial_rotary_factor), head_dim from
  ``head_dim``, else hidden_size // num_attention_heads; an odd one, F,
  rotates ceil(F/2) pairs with exponents 2i/F (transformers' arange(0, F,
  2) / F): rot_dim F + 1 and freq_dim F; a factor that rotates no pair is
  refused (the model's RoPE is the identity);
- a config without rope_theta takes its model class's default_theta, as
  transformers does (a dict config needs transformers installed for it);
- a config.json dict's legacy names, as transformers' config classes
  translate them on loading: n_embd / n_head / n_positions (GPT-2, GPT-J,
  whose base is a fixed 10000), rotary_emb_base and rotary_pct (GPT-NeoX,
  0.25 by default), rotary_dim (the rotated channels, also F; read only
  for GPT-J and CodeGen, 64 by default, and MiniMax-M2, whose config class
  makes it partial_rotary_factor: transformers' code for other models,
  MiniMax-M3-VL's included, ignores it), qk_rope_head_dim (DeepSeek: the rotated head), and Gemma 3's flat
  rope_theta / rope_scaling / rope_local_base_freq, which become per layer
  type (full_attention, sliding_attention: layer_type= is then needed);
- llama3, yarn, longrope: original_max_position_embeddings from the
  config's top level when there is one (Phi-3 keeps it there, and
  transformers gives it priority), else from the rope dict, else
  max_position_embeddings; rope parameters per layer type take their own
  dict's value first;
- yarn and longrope: a missing ``factor`` is max_position_embeddings /
  original_max_position_embeddings; yarn's beta_fast/beta_slow default to
  32/1 when missing or 0, ``truncate`` to True (gpt-oss sets it False);
  as in transformers 5.24 (modeling_rope_utils' _compute_yarn_parameters),
  ``truncate`` is read from the config's rope parameters as a whole: with
  parameters per layer type, from the outer dict, where it is normally
  absent (so True), not from the layer type's own dict;
  an explicit attention_factor of 0 is refused (transformers would scale
  cos and sin by it; the library reads 0 as "derive it");
- dynamic: transformers scales from config.max_position_embeddings (not the
  rope dict's original) with seq_len = max(seq_len, max_position_embeddings);
  the library's L = max(seq_len or max_positions, original_max_positions) is
  the same with original_max_positions = max_position_embeddings;
- longrope: transformers' dynamic update picks long_factor when the running
  sequence (max(position_ids) + 1) is longer than the original context,
  short_factor otherwise, per forward call.  A cache holds one regime:
  ``seq_len`` is passed to the library, which takes long_factor when
  seq_len > original_max_positions (without seq_len: when max_positions
  is).  Build one cache per regime, e.g. seq_len=original for prompts that
  fit the original context and seq_len=original+1 past it;
- proportional (Gemma 4 full-attention layers): rot_dim is the whole
  head_dim (transformers' exponents are 2i/head_dim) and
  partial_rotary_factor the share of pairs that rotate (the rest keep
  angle 0), ``factor`` divides every frequency (default 1); head_dim is
  the layer type's: the per-layer config's head_dim in a PretrainedConfig
  (a top-level multimodal one's text_config object), ``global_head_dim``
  for "full_attention" in a config.json dict read without transformers;
  a Gemma 3 or 4 config.json dict is read through transformers' config
  class where installed (_config_object: the class's per-layer defaults);
- multimodal rope (``mrope_section`` in the rope dict, pairs per T/H/W
  axis; the legacy rope type "mrope" is "default"): the layout comes from
  the model class in transformers, not from the config, so it is chosen by
  model_type where known: Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni,
  PaddleOCR-VL, GLM-4.1V, GLM-4.5V, GLM-OCR, GLM-Image: axes "sections";
  Qwen3-VL, Qwen3-Omni, Qwen3.5, Qwen4-Exp, Cosmos3-Edge, HY-V4-VL (and
  any config with ``mrope_interleaved: true``): axes "interleaved", or
  axes "custom" with transformers' same map where the sections do not
  fill the pairs exactly (Qwen4-Exp's default [11, 11, 10] on 128 pairs);
  NeoMME: two axes, row and column alternating per pair (axes "custom",
  pair_axis j % 2; position ids [2, batch, seq]; per layer type).  A
  model type not listed here whose config has an mrope_section is refused
  (ValueError): the layout is chosen per model class, so build the Cache
  with axes= directly.  HunYuan-VL's mrope_section is refused: transformers'
  code for it is not a rotation per pair.  A listed model type without
  mrope_section in its rope dict gets transformers' class default.  The
  rotation style is not in the config either: GLM-4.1V (model_type glm4v),
  GLM-OCR (glm_ocr) and HY-V4-VL (hy_v4_vl) rotate interleaved pairs, so
  call forward with style="interleaved" (HY-V4-VL: on the trailing
  qk_rope_head_dim channels of each head, the q_rot/k_rot that its
  attention splits off, as for DeepSeek);
  the others use "neox".  Ernie-4.5-VL (ernie4_5_vl_moe): axes
  "alternating"; its config lists the sections as [h, w, t] (default
  [22, 22, 20]), which become sections [t, h, w]; transformers pre-permutes
  the H/W frequencies and undoes it when it interleaves them, so pair j
  keeps frequency column j; it rotates GPT-J pairs: style="interleaved".
  Position ids then have a row per axis: [3, batch, seq] (or [3, tokens]).
- NanoChat is refused (NotImplementedError): its rotate_half is
  cat(x2, -x1), a rotation by minus the angle; the message gives the
  cache to build instead, Cache.from_table(cos, -sin) of the plain table.
"""

_KNOWN_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
# Keys of rope dicts this library has no counterpart for yet.
_UNSUPPORTED_KEYS = ("axial", "rope_section")
# model_type (without "_text") -> (axes, transformers' default mrope_section)
# for the models whose rotary embedding recomposes frequencies per axis.
# "row_col" (NeoMME): two axes, pair j on axis j % 2 (axes="custom").
_MROPE_MODELS = {
    "qwen2_vl": ("sections", [16, 24, 24]),
    "qwen2_5_vl": ("sections", [16, 24, 24]),
    "glm4v": ("sections", [8, 12, 12]),
    "glm4v_moe": ("sections", [8, 12, 12]),
    "glm_ocr": ("sections", [8, 12, 12]),
    "glm_image": ("sections", [8, 12, 12]),
    "paddleocr_vl": ("sections", [16, 24, 24]),
    "qwen2_5_omni": ("sections", [16, 24, 24]),
    "qwen3_omni_moe": ("interleaved", [24, 20, 20]),
    "qwen3_vl": ("interleaved", [24, 20, 20]),
    "qwen3_vl_moe": ("interleaved", [24, 20, 20]),
    "qwen3_5": ("interleaved", [11, 11, 10]),
    "qwen3_5_moe": ("interleaved", [11, 11, 10]),
    "qwen4_exp": ("interleaved", [11, 11, 10]),
    "cosmos3_edge": ("interleaved", [24, 20, 20]),
    # HY-V4-VL: its config class fills in [12, 10, 10] (the modeling code's
    # own fallback, [24, 20, 20], never applies); GPT-J pairs
    "hy_v4_vl": ("interleaved", [12, 10, 10]),
    "neomme": ("row_col", None),
}
# HunYuan-VL: transformers' rotation splits a NeoX pair's two halves over
# different axes (not a rotation per pair), which no axis map reproduces.
_NOT_PER_PAIR = ("hunyuan_vl",)
# Ernie-4.5-VL: sections given as [h, w, t]; transformers' default.
_ERNIE_MROPE = ("ernie4_5_vl", "ernie4_5_vl_moe")
_ERNIE_DEFAULT_SECTION = [22, 22, 20]
# Model types whose transformers code reads the legacy `rotary_dim` (the
# rotated channels): GPT-J and CodeGen in their attention (64 by default in
# their config classes), MiniMax-M2 through its config class
# (partial_rotary_factor = rotary_dim / head_dim).  Others ignore it
# (MiniMax-M3-VL's rotary_dim=64 is not read: it rotates the whole head).
_ROTARY_DIM_MODELS = ("gptj", "codegen", "minimax_m2")
# NanoChat: rotate_half is cat(x2, -x1), a rotation by -angle.
_NEGATED_ROTATION = ("nanochat",)
# Keys that make a config one with RoPE (a config with none of them, as
# GPT-2's or BERT's, has no rotary embedding).
_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim", "rotary_pct",
              "rotary_emb_base", "partial_rotary_factor", "qk_rope_head_dim",
              "rope_local_base_freq")


def _getter(config):
    if isinstance(config, dict):
        return lambda k, d=None: config.get(k, d)
    if hasattr(config, "to_dict") and not hasattr(config, "max_position_embeddings"):
        d = config.to_dict()
        return lambda k, dflt=None: d.get(k, dflt)

    def get(k, d=None):
        try:
            return getattr(config, k, d)
        except RuntimeError:
            # transformers' heterogeneous configs (Gemma 4) refuse a global
            # read of a per-layer attribute: read it per layer type instead
            raise ValueError(f"'{k}' differs between layer types in this config: pass "
                             f"layer_type=") from None
    return get


def _text_config(config):
    """The language model's config of a multimodal or composite config, when
    the top level has no attention heads of its own: a config object's
    get_text_config() (transformers' own choice: text_config, decoder,
    Qwen2.5-Omni's and Qwen3-Omni's thinker's text_config, ...; a config
    object, as to_dict() would flatten Gemma 4's per-layer-type view), else
    its text_config; a dict's "text_config", else "thinker_config"'s."""
    if isinstance(config, dict):
        if config.get("num_attention_heads") is not None:
            return config
        text = config.get("text_config")
        if text is None and isinstance(config.get("thinker_config"), dict):
            text = config["thinker_config"].get("text_config")
        return config if text is None else text
    try:
        heads = getattr(config, "num_attention_heads", None)
    except RuntimeError:     # a heterogeneous config's per-layer attribute
        heads = 1
    if heads is not None:
        return config
    text = None
    if callable(getattr(config, "get_text_config", None)):
        try:
            text = config.get_text_config()
        except (ValueError, TypeError, AttributeError):   # ambiguous: several text configs
            text = None
    if text is None or text is config:
        text = getattr(config, "text_config", None)
    return config if text is None else text


def _has_rope(config, get):
    """Whether the config has any RoPE setting; a config.json dict with none
    is judged by its transformers config class's defaults where installed
    (an older Llama config.json gives no rope_theta: LlamaConfig fills one in)."""
    for k in _ROPE_KEYS:
        try:
            if get(k, None) is not None:
                return True
        except ValueError:      # set, differently per layer type
            return True
    if not isinstance(config, dict):
        return False
    model_type = config.get("model_type")
    try:
        from transformers import CONFIG_MAPPING
        cls = CONFIG_MAPPING[model_type]
    except (ImportError, KeyError, TypeError):
        return True     # unknown here: judged by what follows (rope_theta is looked up)
    try:
        obj = cls()
    except Exception:   # a config class that cannot be built bare: leave it be
        return True
    obj = _text_config(obj)
    return any(getattr(obj, k, None) is not None for k in _ROPE_KEYS)


# Model types whose config.json leaves per-layer-type rope settings to the
# model class's defaults (Gemma 3: rope_theta {"global": 1e6, "local": 1e4};
# Gemma 4: rope_parameters, and the full-attention layers' head_dim in a
# per-layer config that a saved config.json holds as per_layer_config): a
# dict of one is read through transformers' config class.
_CLASS_DEFAULTS = ("gemma3", "gemma3_text", "gemma4", "gemma4_text")


def _config_object(config):
    """A config.json dict of a _CLASS_DEFAULTS model as transformers' config
    object (its defaults filled in as the model sees them); other configs
    as they are.  Without transformers, such a dict is read as it is where
    it spells out what the model class would fill in, else refused."""
    if not isinstance(config, dict) or config.get("model_type") not in _CLASS_DEFAULTS:
        return config
    try:
        from transformers import AutoConfig
    except ImportError:
        text = config.get("text_config") or config
        if str(config.get("model_type")).startswith("gemma4") and \
                not (text.get("rope_parameters") or text.get("rope_scaling")):
            raise ValueError("this Gemma 4 config.json gives no rope_parameters: its model "
                             "class's per-layer defaults need transformers to look up") from None
        return config
    d = dict(config)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _layer_config(config, layer_type):
    """transformers' per-layer-type view of a heterogeneous config (Gemma 4:
    full-attention layers have their own head_dim), else the config."""
    if layer_type is None or isinstance(config, dict) or not hasattr(config, "per_layer_config"):
        return config
    try:
        return config.per_layer_config[layer_type]
    except (ValueError, KeyError, TypeError, IndexError):
        return config


def _required(d, key, rope_type):
    """d[key] of a rope dict, or a ValueError naming what is missing."""
    v = d.get(key)
    if v is None:
        raise ValueError(f"the config's rope parameters have no '{key}', which rope type "
                         f"{rope_type!r} needs")
    return v


def _standard_keys(d):
    """A config.json dict with the legacy names that transformers' config
    classes translate on loading, in the standard ones: GPT-2/GPT-J's
    n_embd, n_head and n_positions (GPT-J's base is modeling_gptj's fixed
    10000); GPT-NeoX's rotary_emb_base and rotary_pct (0.25 by default);
    DeepSeek's qk_rope_head_dim, the rotated head; and
    Gemma 3's flat rope (rope_theta and rope_scaling for the full-attention
    layers, rope_local_base_freq for the sliding ones), made per layer type."""
    d = dict(d)
    for old, new in (("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
                     ("n_positions", "max_position_embeddings"),
                     ("rotary_emb_base", "rope_theta"), ("rotary_pct", "partial_rotary_factor")):
        if d.get(new) is None and d.get(old) is not None:
            d[new] = d[old]
    if d.get("model_type") == "gpt_neox" and d.get("partial_rotary_factor") is None:
        d["partial_rotary_factor"] = 0.25
    if d.get("model_type") == "gptj" and d.get("rope_theta") is None:
        d["rope_theta"] = 10000.0    # modeling_gptj's fixed base
    if d.get("model_type") in ("gptj", "codegen") and "rotary_dim" not in d:
        d["rotary_dim"] = 64         # their config classes' default
    if d.get("qk_rope_head_dim"):
        d["head_dim"] = d["qk_rope_head_dim"]
    rope = d.get("rope_parameters") or d.get("rope_scaling")
    per_layer = isinstance(rope, dict) and any(isinstance(v, dict) for v in rope.values())
    if d.get("rope_local_base_freq") is not None and not per_layer:
        full = dict(rope or {"rope_type": "default"})
        full.setdefault("rope_theta", d.get("rope_theta") or 1e6)   # Gemma 3's global default
        d["rope_parameters"] = {"full_attention": full,
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": d["rope_local_base_freq"]}}
        d.pop("rope_scaling", None)
    return d


def cache_arguments(config, max_positions=None, seq_len=None, layer_type=None):
    """The keyword arguments of fusedrope.Cache for a Hugging Face config."""
    config = _layer_config(_text_config(_config_object(config)), layer_type)
    if isinstance(config, dict):
        config = _standard_keys(config)
    get = _getter(config)
    if not _has_rope(config, get):
        raise ValueError(f"the config (model_type {get('model_type', None)!r}) has no RoPE "
                         f"setting (no rope_parameters, rope_scaling, rope_theta, rotary_dim, "
                         f"partial_rotary_factor, ...): nothing to map (a model without rotary "
                         f"embedding, or one whose rope is in a sub-config: pass that one)")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    if not isinstance(rope, dict):
        rope = dict(rope)
    outer = rope     # transformers' yarn reads `truncate` from this one
    nested = [k for k, v in rope.items() if isinstance(v, dict)]
    if nested:
        if layer_type is None:
            raise NotImplementedError(
                f"rope parameters are given per layer type ({', '.join(nested)}): pass "
                f"layer_type= to choose one")
        if layer_type not in rope:
            raise ValueError(f"layer_type {layer_type!r} not in rope parameters ({nested})")
        rope = rope[layer_type] or {}
    for key in _UNSUPPORTED_KEYS:
        if key in rope:
            raise NotImplementedError(
                f"rope parameter '{key}' (multimodal/axial RoPE) is not supported by libfusedrope")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "su":
        rope_type = "longrope"
    if rope_type == "mrope":   # Qwen2-VL's legacy name: default frequencies, per-axis layout
        rope_type = "default"
    if rope_type not in _KNOWN_TYPES:
        raise NotImplementedError(f"rope_type '{rope_type}' is not supported by libfusedrope "
                                  f"(supported: {', '.join(_KNOWN_TYPES)})")

    theta = rope.get("rope_theta")
    if theta is None:
        theta = get("rope_theta", None)
    if theta is None:
        theta = _default_theta(get)
    prf = rope.get("partial_rotary_factor", get("partial_rotary_factor", None))
    # GPT-J, CodeGen (and MiniMax-M2) give the rotated channels, whose count
    # is also F; other models' code does not read rotary_dim
    rotary_dim = None
    if prf is None and _base_type(get) in _ROTARY_DIM_MODELS:
        rotary_dim = get("rotary_dim", None)
    prf = 1.0 if prf is None else prf
    head_dim = None
    if layer_type == "full_attention" and isinstance(config, dict):
        head_dim = get("global_head_dim", None)     # Gemma 4's config.json
    head_dim = head_dim or get("head_dim", None)
    if not head_dim:
        hidden, heads = get("hidden_size", None), get("num_attention_heads", None)
        if not hidden or not heads:
            raise ValueError("the config has no head_dim, and no hidden_size and "
                             "num_attention_heads to derive it from")
        head_dim = hidden // heads
    freq_dim = None
    if rope_type == "proportional":
        # the whole head in the exponents, a share of the pairs rotating
        rot_dim, pairs = head_dim, int(prf * head_dim // 2)
    else:
        # an odd int(head_dim * prf) is F in the exponents 2i/F of
        # ceil(F/2) pairs (transformers' arange(0, F, 2) / F)
        freq_dim = int(rotary_dim) if rotary_dim else int(head_dim * prf)
        rot_dim = freq_dim + freq_dim % 2
        pairs = rot_dim // 2
        if freq_dim == rot_dim:
            freq_dim = None
    if pairs <= 0:
        raise ValueError(f"partial_rotary_factor {prf} of head_dim {head_dim} rotates no "
                         f"channel: the model's RoPE is the identity (nothing for libfusedrope "
                         f"to apply)")
    max_pos = get("max_position_embeddings")
    if max_positions is None:
        if max_pos is None:
            raise ValueError("the config has no max_position_embeddings: pass max_positions=")
        max_positions = max_pos

    def context(why):
        # transformers reads the model's context from the config for these
        if max_pos is None:
            raise ValueError(f"the config has no max_position_embeddings, which rope type "
                             f"{rope_type!r} needs {why} (max_positions= only sizes the table)")
        return max_pos

    args = dict(type=rope_type, rot_dim=rot_dim, max_positions=int(max_positions),
                theta=float(theta))
    if freq_dim is not None:
        args["freq_dim"] = freq_dim
    mrope = _mrope_arguments(get, rope, rot_dim // 2)
    if not isinstance(mrope, list):     # (a list: refused below, once args are whole)
        args.update(mrope)
    if rope_type in ("llama3", "yarn", "longrope"):
        # a flat rope dict: the config's top level first (Phi-3); a layer
        # type's own dict: its own value (transformers' setdefault)
        orig = None if nested else get("original_max_position_embeddings", None)
        if orig is None:
            orig = rope.get("original_max_position_embeddings")
        if orig is None:
            orig = context("without original_max_position_embeddings")
        args["original_max_positions"] = int(orig)

    if rope_type == "linear":
        args["factor"] = float(_required(rope, "factor", rope_type))
    elif rope_type == "proportional":
        args["partial_rotary_factor"] = float(prf)
        args["factor"] = float(rope.get("factor", 1.0) or 1.0)
    elif rope_type == "dynamic":
        args["factor"] = float(_required(rope, "factor", rope_type))
        args["original_max_positions"] = int(context("as its original context"))
        if seq_len is not None:
            args["seq_len"] = int(seq_len)
    elif rope_type == "llama3":
        args.update(factor=float(_required(rope, "factor", rope_type)),
                    low_freq_factor=float(_required(rope, "low_freq_factor", rope_type)),
                    high_freq_factor=float(_required(rope, "high_freq_factor", rope_type)))
    elif rope_type in ("yarn", "longrope"):
        factor = rope.get("factor")
        if factor is None:
            factor = context("without a factor") / args["original_max_positions"]
        args["factor"] = float(factor)
        if rope.get("attention_factor") is not None:
            if float(rope["attention_factor"]) == 0.0:
                raise ValueError("attention_factor 0 in the config: transformers multiplies cos "
                                 "and sin by it (an all-zero table), while libfusedrope reads 0 "
                                 "as 'derive it'; refused rather than built differently")
            args["attention_factor"] = float(rope["attention_factor"])
        if rope_type == "yarn":
            args.update(beta_fast=float(rope.get("beta_fast") or 32),
                        beta_slow=float(rope.get("beta_slow") or 1),
                        truncate=bool(outer.get("truncate", True)))
            for k in ("mscale", "mscale_all_dim"):
                if rope.get(k):
                    args[k] = float(rope[k])
        else:
            short = _required(rope, "short_factor", rope_type)
            long = _required(rope, "long_factor", rope_type)
            args.update(short_factor=[float(v) for v in short],
                        long_factor=[float(v) for v in long])
            if seq_len is not None:
                args["seq_len"] = int(seq_len)
    if isinstance(mrope, list):
        raise ValueError(
            f"model_type {get('model_type', None)!r} has mrope_section {mrope} but is not one "
            f"this mapping knows: the multimodal layout (sections, interleaved, ...) and "
            f"rotation style are chosen per model class in transformers, not by the config. "
            f"Read the model's rotary embedding and build the cache with axes= directly, e.g. "
            f"fusedrope.Cache(**{dict(args)!r}, axes='sections' or 'interleaved', "
            f"sections={mrope}), or set mrope_interleaved: true in the rope parameters if "
            f"it interleaves T/H/W as Qwen3-VL does")
    if _base_type(get) in _NEGATED_ROTATION:
        raise NotImplementedError(
            f"model_type {get('model_type', None)!r}: transformers' rotate_half for this model "
            f"is cat(x2, -x1), a rotation by minus the angle, which no rotation style of "
            f"libfusedrope applies; build the table and negate its sin: "
            f"cos, sin = fusedrope.Cache(**{dict(args)!r}).table(); "
            f"cache = fusedrope.Cache.from_table(cos, -sin)")
    return args


def _default_theta(get):
    """transformers' rope_theta for a config that gives none: its model
    class's default_theta (10000 for most; SmolLM3 2e6, Qwen3-VL 5e6, ...)."""
    theta = get("default_theta", None)      # a PretrainedConfig's class attribute
    if theta is not None:
        return theta
    model_type = get("model_type", None)
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING[model_type].default_theta
    except (ImportError, KeyError, AttributeError):
        raise ValueError(f"the config gives no rope_theta, and transformers' default for it "
                         f"is its model class's (model_type {model_type!r}), which needs "
                         f"transformers to look up: add rope_theta to the config") from None


def _base_type(get):
    """The config's model_type without a trailing "_text"."""
    model_type = str(get("model_type", "") or "")
    return model_type[:-5] if model_type.endswith("_text") else model_type


def _interleaved_map(section, pairs):
    """transformers' interleaved T/H/W recomposition (Qwen3-VL's
    apply_interleaved_mrope): pair j takes axis 1 if j % 3 == 1 and
    j < 3*section[1], axis 2 if j % 3 == 2 and j < 3*section[2], else 0."""
    return [1 if j % 3 == 1 and j < 3 * section[1] else
            2 if j % 3 == 2 and j < 3 * section[2] else 0 for j in range(pairs)]


def _mrope_arguments(get, rope, pairs):
    """axes= and sections= (or pair_axis=) for a multimodal-rope config, else
    {}; the mrope_section list of a model type this mapping does not know."""
    model_type = str(get("model_type", "") or "")
    base = _base_type(get)
    section = rope.get("mrope_section")
    if base in _NOT_PER_PAIR and section is not None:
        raise NotImplementedError(
            f"{model_type}: transformers' multimodal rope for this model sends the two halves "
            f"of a rotation pair to different axes, which is not a rotation per pair; build "
            f"the cache with an explicit axis map (axes='custom', pair_axis=) instead")
    if base in _ERNIE_MROPE:
        h, w, t = [int(v) for v in (section or _ERNIE_DEFAULT_SECTION)]
        return dict(axes="alternating", sections=[t, h, w])
    known = _MROPE_MODELS.get(base)
    if known is not None and known[0] == "row_col":
        # NeoMME: row0-col0-row1-col1..., two axes, frequency column j
        return dict(axes="custom", pair_axis=[j % 2 for j in range(pairs)])
    if section is None:
        if known is None:
            return {}
        section = known[1]
    section = [int(v) for v in section]
    if rope.get("mrope_interleaved"):
        axes = "interleaved"
    elif known is None:
        return section      # refused by the caller: the layout is the model class's
    else:
        axes = known[0]
    if axes == "interleaved":
        if len(section) != 3:
            raise ValueError(f"{model_type}: mrope_section {section} has {len(section)} "
                             f"entries; the interleaved layout takes three (T, H, W)")
        amap = _interleaved_map(section, pairs)
        if sum(section) != pairs or [amap.count(a) for a in range(3)] != section:
            # transformers' rule where the sections do not cover the pairs
            # exactly (e.g. Qwen4-Exp's default [11, 11, 10] of 128 pairs)
            return dict(axes="custom", pair_axis=amap)
    return dict(axes=axes, sections=section)
