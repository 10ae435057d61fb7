"""Hugging Face model configs -> fusedrope.Cache arguments.

Mirrors transformers' modeling_rope_utils (checked against transformers
5.23.0; the older rope_scaling layout of 4.x is read too):

- rope parameters: ``rope_parameters`` (transformers >= 4.57/5), else
  ``rope_scaling`` (older); rope_type from "rope_type", else the legacy
  "type" ("su" is LongRoPE's old name); ``rope_theta`` and
  ``partial_rotary_factor`` from the dict, else from the config's top level;
- rot_dim = int(head_dim * partial_rotary_factor), head_dim from
  ``head_dim``, else hidden_size // num_attention_heads;
- llama3, yarn, longrope: original_max_position_embeddings from the
  config's top level when there is one (Phi-3 keeps it there, and
  transformers gives it priority), else from the rope dict, else
  max_position_embeddings;
- yarn and longrope: a missing ``factor`` is max_position_embeddings /
  original_max_position_embeddings; yarn's beta_fast/beta_slow default to
  32/1 when missing or 0, ``truncate`` to True (gpt-oss sets it False);
- dynamic: transformers scales from config.max_position_embeddings (not the
  rope dict's original) with seq_len = max(seq_len, max_position_embeddings);
  the library's L = max(seq_len or max_positions, original_max_positions) is
  the same with original_max_positions = max_position_embeddings;
- longrope: transformers picks long_factor when the running sequence is
  longer than the original context, short_factor otherwise; the library
  picks long_factor when max_positions > original_max_positions, so build
  the cache with max_positions <= original for short-context use.
"""

_KNOWN_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Keys of rope dicts this library has no counterpart for yet.
_UNSUPPORTED_KEYS = ("mrope_section", "mrope_interleaved", "axial", "rope_section")


def _getter(config):
    if isinstance(config, dict):
        return lambda k, d=None: config.get(k, d)
    if hasattr(config, "to_dict") and not hasattr(config, "max_position_embeddings"):
        d = config.to_dict()
        return lambda k, dflt=None: d.get(k, dflt)
    return lambda k, d=None: getattr(config, k, d)


def cache_arguments(config, max_positions=None, seq_len=None, layer_type=None):
    """The keyword arguments of fusedrope.Cache for a Hugging Face config."""
    get = _getter(config)
    rope = get("rope_parameters") or get("rope_scaling") or {}
    if not isinstance(rope, dict):
        rope = dict(rope)
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
    if rope_type not in _KNOWN_TYPES:
        raise NotImplementedError(f"rope_type '{rope_type}' is not supported by libfusedrope "
                                  f"(supported: {', '.join(_KNOWN_TYPES)})")

    theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    prf = rope.get("partial_rotary_factor", get("partial_rotary_factor", None))
    prf = 1.0 if prf is None else prf
    head_dim = get("head_dim", None) or get("hidden_size") // get("num_attention_heads")
    rot_dim = int(head_dim * prf)
    max_pos = get("max_position_embeddings")
    if max_positions is None:
        if max_pos is None:
            raise ValueError("the config has no max_position_embeddings: pass max_positions=")
        max_positions = max_pos

    args = dict(type=rope_type, rot_dim=rot_dim, max_positions=int(max_positions),
                theta=float(theta))
    if rope_type in ("llama3", "yarn", "longrope"):
        orig = get("original_max_position_embeddings", None)
        if orig is None:
            orig = rope.get("original_max_position_embeddings", max_pos)
        args["original_max_positions"] = int(orig)

    if rope_type == "linear":
        args["factor"] = float(rope["factor"])
    elif rope_type == "dynamic":
        args["factor"] = float(rope["factor"])
        args["original_max_positions"] = int(max_pos)
        if seq_len is not None:
            args["seq_len"] = int(seq_len)
    elif rope_type == "llama3":
        args.update(factor=float(rope["factor"]),
                    low_freq_factor=float(rope["low_freq_factor"]),
                    high_freq_factor=float(rope["high_freq_factor"]))
    elif rope_type in ("yarn", "longrope"):
        factor = rope.get("factor")
        if factor is None:
            factor = max_pos / args["original_max_positions"]
        args["factor"] = float(factor)
        if rope.get("attention_factor") is not None:
            args["attention_factor"] = float(rope["attention_factor"])
        if rope_type == "yarn":
            args.update(beta_fast=float(rope.get("beta_fast") or 32),
                        beta_slow=float(rope.get("beta_slow") or 1),
                        truncate=bool(rope.get("truncate", True)))
            for k in ("mscale", "mscale_all_dim"):
                if rope.get(k):
                    args[k] = float(rope[k])
        else:
            args.update(short_factor=[float(v) for v in rope["short_factor"]],
                        long_factor=[float(v) for v in rope["long_factor"]])
    return args
