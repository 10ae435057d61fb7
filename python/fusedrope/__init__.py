"""fusedrope: rotary position embeddings (RoPE) for q/k tensors, forward and
backward, through libfusedrope (CUDA and OpenMP).

Arrays come in and go out through DLPack (``__dlpack__``), so NumPy arrays,
PyTorch tensors (CPU and CUDA) and CuPy arrays are used without copies::

    import fusedrope
    cache = fusedrope.Cache("llama3", rot_dim=128, max_positions=131072,
                            theta=500000.0, factor=8.0, original_max_positions=8192)
    fusedrope.forward_qk(cache, q, k, layout="bshd")        # in place

See the top-level README ("Python") and fusedrope(3) for the semantics.
"""
import contextlib
import itertools
import operator
import os
import sys
import threading
import weakref

import numpy as np

from . import _fusedrope
from ._version import __version__

__all__ = [
    "Cache", "Error", "forward", "backward", "forward_qk", "backward_qk",
    "norm_forward_qk", "norm_backward_qk",
    "version", "cuda_available", "ROPE_TYPES", "AXES",
]


class Error(RuntimeError, ValueError):
    """A failure reported by libfusedrope.

    ``status`` is the fusedrope_status value (int), ``status_name`` its name
    ("ERR_INVALID", "ERR_RANGE", "ERR_NOMEM", "ERR_UNSUPPORTED", "ERR_CUDA"),
    and ``detail`` the library's fusedrope_last_error() sentence.
    """

    status = None
    status_name = None
    detail = ""

    def __str__(self):
        base = super().__str__()
        return f"{self.status_name}: {base}" if self.status_name else base


# The extension keeps the first Error registered: a package run again
# (importlib.reload, a second import) raises and catches that same class.
Error = _fusedrope._set_error_class(Error)

ROPE_TYPES = {"default": 0, "linear": 1, "dynamic": 2, "yarn": 3, "longrope": 4, "llama3": 5,
              "proportional": 6}
# fusedrope_axes: how each rotation pair picks its position axis and
# frequency column (fusedrope.h; None is FUSEDROPE_AXES_NONE, 1D rope).
AXES = {None: 0, "sections": 1, "interleaved": 2, "alternating": 3, "vision_2d": 4, "custom": 5}
_STYLES = {"neox": 0, "interleaved": 1}
_LAYOUTS = {"sbhd": 0, "bshd": 1, "thd": 2}
_DEV_CPU, _DEV_CUDA = 1, 2
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def version():
    """(version string, version number) of the library linked in."""
    return _fusedrope.version()


def cuda_available():
    """True when the library was built with CUDA and a device is present."""
    return _fusedrope.cuda_available()


# ------------------------------------------------------------------ devices

def _current_cuda_device():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.cuda.runtime.getDevice()
    return 0


@contextlib.contextmanager
def _cuda_device(index):
    """Makes CUDA device `index` current for the library's calls (the
    library works on the current device), through whichever of PyTorch and
    CuPy is loaded; without either the CUDA runtime's default, device 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        with torch.cuda.device(index):
            yield
        return
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(index):
            yield
        return
    if index != 0:
        if torch is not None:  # imported, but it sees no CUDA device
            raise ValueError(f"CUDA device {index}: PyTorch sees no CUDA device "
                             f"(torch.cuda.is_available() is False)")
        raise ValueError(f"selecting CUDA device {index} needs PyTorch or CuPy to be imported")
    yield


def _parse_device(device):
    if device is None:
        return _DEV_CPU, -1
    d = str(device)
    if d == "cpu":
        return _DEV_CPU, -1
    if d == "cuda":
        return _DEV_CUDA, _current_cuda_device()
    if d.startswith("cuda:") and d[5:].isdigit():
        return _DEV_CUDA, int(d[5:])
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")


# -------------------------------------------------------------------- cache

_cache_ids = itertools.count(1)
_cache_ids_lock = threading.Lock()  # ids unique on a free-threaded CPython too
_caches = weakref.WeakValueDictionary()  # id -> Cache, for fusedrope.torch's ops

_FIELDS = ("factor", "original_max_positions", "seq_len", "attention_factor", "beta_fast",
           "beta_slow", "mscale", "mscale_all_dim", "truncate", "low_freq_factor",
           "high_freq_factor", "short_factor", "long_factor", "partial_rotary_factor", "axes",
           "sections", "pair_axis", "pair_col", "freq_dim", "num_threads")


class Cache:
    """The cos/sin table of a rope type on one device (fusedrope_cache_create).

    ``Cache(type, rot_dim=..., max_positions=..., theta=10000.0, **fields,
    device="cpu")``: ``type`` is one of "default", "linear", "dynamic",
    "yarn", "longrope", "llama3", "proportional"; ``fields`` are the members
    of fusedrope_cache_config by name (factor, original_max_positions,
    seq_len, attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim,
    truncate, low_freq_factor, high_freq_factor, short_factor, long_factor,
    partial_rotary_factor, axes, sections, pair_axis, pair_col, freq_dim,
    num_threads); those left at None keep the library's defaults for the
    type (fusedrope_cache_create(3)).

    - ``seq_len``: dynamic builds its table for it; longrope takes
      long_factor when it exceeds original_max_positions, short_factor
      otherwise (default: max_positions decides).
    - ``partial_rotary_factor`` (proportional, Gemma 4): the share of the
      rot_dim/2 pairs that rotate; the others keep angle 0.
    - ``axes`` (multimodal rope): None, "sections", "interleaved",
      "alternating", "vision_2d" or "custom"; ``sections``: up to 4 pair
      counts per position axis (e.g. Qwen2-VL's mrope_section [16, 24, 24]);
      ``pair_axis``/``pair_col``: rot_dim/2 ints each for "custom".  Pass
      position ids with a row per axis to forward & co.
    - ``freq_dim``: F in the exponents 2i/F (0 or None: rot_dim; rot_dim/2
      for "vision_2d").
    - ``num_threads``: most OpenMP threads a call on this cache uses, 0..1024
      (0 or None: the OpenMP default); ignored by CUDA caches and by a
      library built without OpenMP (fusedrope_cache_create(3)).

    ``device`` is "cpu", "cuda" (the current CUDA device) or "cuda:N".  The
    table is released with the object's last reference: keep a CUDA cache
    referenced while work using it is queued or a graph that captured it
    can replay (fusedrope_cache_destroy(3)).
    """

    def __init__(self, type="default", rot_dim=None, max_positions=None, theta=10000.0, *,
                 factor=None, original_max_positions=None, seq_len=None, attention_factor=None,
                 beta_fast=None, beta_slow=None, mscale=None, mscale_all_dim=None, truncate=None,
                 low_freq_factor=None, high_freq_factor=None, short_factor=None, long_factor=None,
                 partial_rotary_factor=None, axes=None, sections=None, pair_axis=None,
                 pair_col=None, freq_dim=None, num_threads=None, device="cpu"):
        if type not in ROPE_TYPES:
            raise ValueError(f"type must be one of {sorted(ROPE_TYPES)}, not {type!r}")
        if rot_dim is None or max_positions is None:
            raise TypeError("Cache() needs rot_dim and max_positions")
        if axes not in AXES:
            raise ValueError(f"axes must be one of {list(AXES)}, not {axes!r}")
        if (pair_axis is not None or pair_col is not None) and axes != "custom":
            raise ValueError("pair_axis and pair_col go with axes='custom'")

        def ints(v):
            return None if v is None else [_int(x, "an entry of a list of ints") for x in v]
        fields = dict(factor=factor, original_max_positions=original_max_positions,
                      seq_len=seq_len, attention_factor=attention_factor, beta_fast=beta_fast,
                      beta_slow=beta_slow, mscale=mscale, mscale_all_dim=mscale_all_dim,
                      truncate=None if truncate is None else _flag(truncate, "truncate"),
                      low_freq_factor=low_freq_factor,
                      high_freq_factor=high_freq_factor,
                      short_factor=None if short_factor is None
                      else [_real(v, "an entry of short_factor") for v in short_factor],
                      long_factor=None if long_factor is None
                      else [_real(v, "an entry of long_factor") for v in long_factor],
                      partial_rotary_factor=partial_rotary_factor,
                      axes=AXES[axes] or None, sections=ints(sections),
                      pair_axis=ints(pair_axis), pair_col=ints(pair_col), freq_dim=freq_dim,
                      num_threads=num_threads)
        dev, dev_id = _parse_device(device)
        ctx = _cuda_device(dev_id) if dev == _DEV_CUDA else contextlib.nullcontext()
        with ctx:
            handle = _fusedrope.cache_create(ROPE_TYPES[type], _cint(rot_dim, "rot_dim"),
                                             _cint(max_positions, "max_positions", 64),
                                             _real(theta, "theta"), dev, dev_id, fields)
        params = {"theta": float(theta), **{k: v for k, v in fields.items() if v is not None}}
        if axes is not None:
            params["axes"] = axes
        self._init(handle, type, params)

    def _init(self, handle, type, params):
        self._h = handle
        self.type = type
        self.params = params
        with _cache_ids_lock:
            self.id = next(_cache_ids)
        _caches[self.id] = self

    @classmethod
    def from_table(cls, cos, sin, device="cpu"):
        """A cache from a host table: cos and sin of shape [positions, rot_dim/2]
        (anything np.asarray takes; converted to float32), used as they are."""
        cos = np.ascontiguousarray(cos, dtype=np.float32)
        sin = np.ascontiguousarray(sin, dtype=np.float32)
        if cos.ndim != 2 or cos.shape != sin.shape:
            raise ValueError(f"cos and sin must both be [positions, rot_dim/2]; got {cos.shape} "
                             f"and {sin.shape}")
        dev, dev_id = _parse_device(device)
        ctx = _cuda_device(dev_id) if dev == _DEV_CUDA else contextlib.nullcontext()
        with ctx:
            handle = _fusedrope.cache_from_table(cos, sin, cos.shape[0], 2 * cos.shape[1], dev,
                                                 dev_id)
        self = cls.__new__(cls)
        self._init(handle, None, {})
        return self

    @classmethod
    def from_config(cls, config, max_positions=None, device="cpu", *, seq_len=None,
                    layer_type=None):
        """A cache from a Hugging Face model config (a dict as in config.json,
        or a PretrainedConfig), mapped as transformers' modeling_rope_utils
        does; see fusedrope._hf.cache_arguments.  ``seq_len``: the sequence
        length a dynamic table is built for, and the LongRoPE regime
        (long factors past the original context): one cache per regime.
        ``layer_type``: for per-layer-type rope parameters (Gemma 3/4)."""
        from ._hf import cache_arguments
        if config is None or isinstance(config, (str, bytes, os.PathLike, int, float)):
            raise TypeError("config must be a dict (a config.json's contents) or a "
                            f"transformers PretrainedConfig, not {type(config).__name__}")
        args = cache_arguments(config, max_positions=max_positions, seq_len=seq_len,
                               layer_type=layer_type)
        return cls(**args, device=device)

    # A cache never changes after it is built: a copy (copy.copy, or
    # copy.deepcopy of a module that holds one) is the cache itself.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    @property
    def rot_dim(self):
        return self._h.rot_dim

    @property
    def max_positions(self):
        return self._h.max_positions

    @property
    def device(self):
        return "cpu" if self._h.device == _DEV_CPU else f"cuda:{self._h.device_id}"

    def table(self):
        """(cos, sin): copies of the table as float32 NumPy arrays
        [max_positions, rot_dim/2] (fusedrope_cache_copy_table)."""
        if self.max_positions == 0:
            raise ValueError("this cache has no table (max_positions 0)")
        shape = (self.max_positions, self.rot_dim // 2)
        cos, sin = np.empty(shape, np.float32), np.empty(shape, np.float32)
        self._h.copy_table(cos, sin)
        return cos, sin

    def check(self, stream=None):
        """fusedrope_cache_check: waits for `stream` (default: PyTorch's
        current stream when PyTorch is imported with CUDA, else the default
        stream; CuPy users pass theirs) and raises Error (ERR_RANGE) if a
        CUDA kernel met a token without a valid position."""
        if self._h.device_id < 0:
            return
        with _cuda_device(self._h.device_id):
            self._h.check(_stream_of([], self._h.device_id, stream)[0])

    def __repr__(self):
        return (f"fusedrope.Cache(type={self.type!r}, rot_dim={self.rot_dim}, "
                f"max_positions={self.max_positions}, device={self.device!r})")


# ------------------------------------------------------------------- arrays

def _stream_of(arrays, dev_id, stream):
    """The CUDA stream to run on: the one given, else PyTorch's current
    stream when PyTorch tensors are passed (so calls are captured in CUDA
    graphs), else CuPy's current stream for CuPy arrays, else the default
    stream (0); and whether it is PyTorch's current stream by that rule."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))), False
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("torch"):
            import torch
            return torch.cuda.current_stream(dev_id).cuda_stream, True
        if mod.startswith("cupy"):
            import cupy
            return cupy.cuda.get_current_stream().ptr, False
    if not arrays:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_stream(dev_id).cuda_stream, True
    return 0, False


def _export_stream(a, cuda_stream, torch_current):
    """The stream a CUDA array's __dlpack__ is asked to order its work
    before: -1 (DLPack: no synchronisation) for a PyTorch tensor when the
    call runs on PyTorch's current stream (torch_current), whose work is
    ordered already, else the call's stream (1, DLPack's legacy default
    stream, for stream 0, which DLPack does not allow).  PyTorch answers any
    other value with a current-stream lookup, an ExternalStream and, on a
    different stream, an event: Python work on every array of every call."""
    if torch_current and type(a).__module__.startswith("torch"):
        return -1
    return cuda_stream if cuda_stream else 1


def _torch_direct(a, torch_current):
    """Whether a is a plain PyTorch tensor that tensor.__dlpack__ would
    export as it stands, with no stream to order: not requiring gradient,
    no conjugate bit, strided, no __torch_function__ override (a subclass,
    a mode), and on the CPU or, for a call on PyTorch's current stream, on
    CUDA.  Such a tensor goes through torch.utils.dlpack.to_dlpack, the
    same export without __dlpack__'s and __dlpack_device__'s Python-level
    work: about 7 us a tensor on the CPU, most of a small call's cost
    (bench/RESULTS.md).  The capsule carries the tensor's device, which the
    extension checks against the cache's."""
    torch = sys.modules.get("torch")
    if torch is None or type(a) is not torch.Tensor:
        return False
    if a.requires_grad or a.is_conj() or a.layout is not torch.strided or \
            torch.overrides.has_torch_function_unary(a):
        return False
    return not a.is_cuda or torch_current


class _WritableAlias:
    """A read-only NumPy array's memory as a writable array interface: NumPy
    before 2.1 exports no read-only array through DLPack (its capsules had
    no flag to say so), so _capsule exports this alias instead and marks the
    capsule read-only itself; the extension refuses to write through it."""

    def __init__(self, a):
        self.base = a  # keeps the memory alive as long as the alias
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface


def _capsule(a, what, cuda_stream, torch_current=False):
    """a.__dlpack__(), asking for a versioned capsule (it carries the
    read-only flag) where the producer offers one; a plain PyTorch tensor
    with no stream to order through to_dlpack (_torch_direct); a read-only
    NumPy array of a NumPy without versioned capsules as (capsule, True),
    the extension's read-only mark.  A producer's refusal (BufferError, or
    RuntimeError from PyTorch before 2.4: a tensor on device "meta", one
    that requires gradient) becomes the ValueError that names the argument."""
    if _torch_direct(a, torch_current):
        try:
            return sys.modules["torch"].utils.dlpack.to_dlpack(a)
        except (BufferError, RuntimeError) as e:  # no memory to export (device "meta")
            raise ValueError(f"{what} cannot be passed through DLPack: {e}") from None
    if not hasattr(a, "__dlpack__"):
        raise TypeError(f"{what} must support DLPack (__dlpack__): a NumPy array, a PyTorch "
                        f"tensor, a CuPy array...; got {type(a).__name__}")
    dev_type, _ = a.__dlpack_device__()
    kw = {}
    if int(dev_type) in (_DL_CUDA, _DL_CUDA_MANAGED):
        kw["stream"] = _export_stream(a, cuda_stream, torch_current)
    try:
        try:
            return a.__dlpack__(max_version=(1, 0), **kw)
        except TypeError:  # a producer of DLPack before 1.0's versioned capsules
            pass
        if isinstance(a, np.ndarray) and not a.flags.writeable:
            return np.asarray(_WritableAlias(a)).__dlpack__(), True
        return a.__dlpack__(**kw)
    # the producer cannot export it (NumPy: odd byte strides)
    except (BufferError, RuntimeError) as e:
        raise ValueError(f"{what} cannot be passed through DLPack: {e}") from None


def _bf16_view(a):
    """NumPy arrays of ml_dtypes.bfloat16 cannot be exported through DLPack;
    they are passed as their uint16 bits, marked bfloat16."""
    if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
        return a.view(np.uint16), True
    return a, False


def _dtype_name(a):
    return str(getattr(a, "dtype", "")).rsplit(".", 1)[-1]


def _bits_need_dtype(a, name, dtype):
    """16-bit integers are bfloat16 bits only when the call says so: with
    a bfloat16 array beside them they would otherwise pass as bfloat16."""
    if dtype != "bfloat16" and _dtype_name(a) in ("uint16", "int16"):
        raise TypeError(f"{name} has dtype {_dtype_name(a)}; 16-bit integer arrays are taken "
                        f"as bfloat16 bits only with dtype='bfloat16'")


def _int(v, what):
    """v as an int, refusing what is not one (a float or a string is not
    truncated or parsed)."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(v).__name__} {v!r}") from None


def _cint(v, what, bits=32):
    """_int(v), which must fit the C argument's signed `bits`-bit int
    (ValueError, not the OverflowError of the conversion)."""
    v = _int(v, what)
    if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
        raise ValueError(f"{what} is {v}, outside the range of a {bits}-bit int")
    return v


def _flag(v, what):
    """v as a bool: a bool (NumPy's too) or an int, not a string (which
    would be true whatever it says)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return bool(_int(v, what))


def _real(v, what):
    """v as a float, refusing a string (float() would parse it) and what
    is not a number."""
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{what} must be a number, not {type(v).__name__} {v!r}")
    try:
        return float(v)
    except TypeError:
        raise TypeError(f"{what} must be a number, not {type(v).__name__} {v!r}") from None


def _positions(p, what, np_dtype, cache):
    if p is None or hasattr(p, "__dlpack__"):
        return p
    if isinstance(p, (list, tuple, range)):
        if cache._h.device_id >= 0:
            raise TypeError(f"{what}: a CUDA cache needs a device array, not a {type(p).__name__}")
        a = np.asarray(p)
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers, not {a.dtype} values (positions are "
                            "not rounded)")
        info = np.iinfo(np_dtype)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise ValueError(f"{what}: {a.min() if a.min() < info.min else a.max()} does not "
                             f"fit the {np.dtype(np_dtype)} the library takes")
        return a.astype(np_dtype)
    raise TypeError(f"{what} must be an array (DLPack) or a list of ints, not {type(p).__name__}")


def _compact_ids(ids, layout):
    """Host ids whose positions are not compact within a row, as a compact
    copy (a few int64 a token): transformers' text and decode position_ids,
    arange(s).view(1, 1, -1).expand(3, b, -1), have a batch stride of 0,
    which the library's rows cannot say.  A row stride of 0 (every axis at
    one position) stays one row.  Device ids are left to the library's
    check: a copy would run on another stream than the call."""
    base = 1 if layout == "thd" else 2
    if isinstance(ids, np.ndarray):
        nd, compact = ids.ndim, lambda a: a.flags["C_CONTIGUOUS"]
        copy, stride0 = np.ascontiguousarray, lambda a: a.strides[0]
    elif type(ids).__module__.startswith("torch") and getattr(ids, "is_cuda", True) is False:
        nd, compact = ids.dim(), lambda a: a.is_contiguous()
        copy, stride0 = lambda a: a.contiguous(), lambda a: a.stride(0)
    else:
        return ids
    if nd == base + 1 and ids.shape[0] > 1 and stride0(ids) == 0:
        ids = ids[0]                     # a broadcast: one row for every axis
        nd = base
    if nd == base + 1 and ids.shape[0] > 0 and not compact(ids[0]):
        return copy(ids)
    if nd == base and not compact(ids):
        return copy(ids)
    return ids


def _prepare(cache, arrays, names, style, layout, ids, offsets, cu_seqlens, dtype, stream,
             range_status, extra=()):
    """Checks a call's arguments and exports its arrays (None entries stay
    None): (capsules, extra capsules, position capsules, bf16, stream, the
    device context to run in).  `arrays` are the tensors, `extra` the
    norm's weight/rstd/gradient arrays ((array, name) pairs)."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a fusedrope.Cache, not {type(cache).__name__}")
    if style not in _STYLES:
        raise ValueError(f"style must be 'neox' or 'interleaved', not {style!r}")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'sbhd', 'bshd' or 'thd', not {layout!r}")
    if dtype not in (None, "float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be None, 'float32', 'float16' or 'bfloat16', not {dtype!r}")
    bf16 = dtype == "bfloat16"
    views = []
    for a, name in zip(arrays, names):
        if a is None:
            views.append(None)
            continue
        if dtype is not None and dtype != "bfloat16" and _dtype_name(a) != dtype:
            raise TypeError(f"{name} has dtype {_dtype_name(a)}, not {dtype}")
        _bits_need_dtype(a, name, dtype)
        v, is_bf16 = _bf16_view(a)
        bf16 = bf16 or is_bf16
        views.append(v)
    for a, name in extra:
        if a is not None:
            _bits_need_dtype(a, name, dtype)
    extra_views = [None if a is None else _bf16_view(a)[0] for a, _ in extra]
    ids = _compact_ids(_positions(ids, "ids", np.int64, cache), layout)
    offsets = _positions(offsets, "offsets", np.int64, cache)
    cu_seqlens = _positions(cu_seqlens, "cu_seqlens", np.int32, cache)
    dev_id = cache._h.device_id
    cuda = dev_id >= 0
    s, tc = _stream_of([a for a in arrays if a is not None], dev_id, stream) if cuda \
        else (0, False)
    caps, seen = [], {}
    for a, name in zip(views, names):
        # The same object as input and output (in place) is exported once.
        if a is not None and id(a) not in seen:
            seen[id(a)] = _capsule(a, name, s, tc)
        caps.append(None if a is None else seen[id(a)])
    extra_caps = [None if a is None else _capsule(a, n, s, tc)
                  for a, (_, n) in zip(extra_views, extra)]
    if range_status is not None and not hasattr(range_status, "__dlpack__"):
        raise TypeError("range_status must be an array (DLPack) of one int32")
    pos = [None if p is None else _capsule(p, n, s, tc)
           for p, n in ((ids, "ids"), (offsets, "offsets"), (cu_seqlens, "cu_seqlens"),
                        (range_status, "range_status"))]
    ctx = _cuda_device(dev_id) if cuda else contextlib.nullcontext()
    return caps, extra_caps, pos, bf16, s, ctx


def _written(arrays):
    """Moves the version counter of each PyTorch tensor among the arrays a
    call wrote, as PyTorch's own in-place and out= operations do, so that
    autograd refuses a graph that saved their old values (a tensor another
    operation saved for its backward, then rotated in place here, gave wrong
    gradients silently until 2026-11-30)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    bump = getattr(torch.autograd.graph, "increment_version", None)  # PyTorch >= 2.1
    for a in arrays:
        if bump is not None and isinstance(a, torch.Tensor):
            bump(a)


def _apply(op, cache, ins, outs, names, style, layout, ids, offsets, cu_seqlens, cp_size,
           cp_rank, dtype, stream, range_status=None):
    for x, name in zip(ins, names[::2]):
        if x is None:
            raise TypeError(f"{name} is None; an array is needed")
    outs = [x if o is None else o for x, o in zip(ins, outs)]
    caps, _, pos, bf16, s, ctx = _prepare(cache, list(itertools.chain(*zip(ins, outs))), names,
                                          style, layout, ids, offsets, cu_seqlens, dtype,
                                          stream, range_status)
    with ctx:
        _fusedrope.apply(cache._h, op, _STYLES[style], _LAYOUTS[layout], bf16, caps, *pos[:3],
                         _cint(cp_size, "cp_size"), _cint(cp_rank, "cp_rank"), s, pos[3])
    _written(outs)
    return outs


_DOC = """
    style: "neox" (rotate_half) or "interleaved" (GPT-J).  layout: "sbhd",
    "bshd" (4-D arrays) or "thd" (3-D, packed).  Channels must be contiguous;
    the other strides are taken from the arrays.  Positions: ids ([batch,
    seq] int64, or [tokens] for thd; for a cache with position axes, a row
    per axis: [axes, batch, seq] or [axes, tokens], contiguous within a row
    (host ids that are not are copied compact), rows any stride apart, e.g.
    a view of a [axes, max_tokens] buffer; a row stride of 0, a broadcast
    view, puts every axis at the same position),
    offsets (int64 per batch entry or per sequence), cu_seqlens (int32,
    num_seqs+1, thd), cp_size, cp_rank; arrays on the cache's device (lists
    are accepted for a CPU cache).  range_status: a one-element int32 device
    array the CUDA kernels set to 1 for a token without a valid position
    (fusedrope_positions.range_status).  out: the
    output array(s) for an out-of-place call; in place by default.  dtype:
    "bfloat16" to pass bfloat16 as 16-bit integer arrays (NumPy).  stream: a
    CUDA stream (int, torch.cuda.Stream, cupy stream); default: PyTorch's
    (or CuPy's) current stream.  Failures raise fusedrope.Error (library) or
    ValueError/TypeError (arguments); nothing is written then.
"""


def forward(cache, x, *, style="neox", layout="sbhd", out=None, ids=None, offsets=None,
            cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None, stream=None, range_status=None):
    return _apply(0, cache, [x], [out], ["x", "out"], style, layout, ids, offsets, cu_seqlens,
                  cp_size, cp_rank, dtype, stream, range_status)[0]


def backward(cache, dy, *, style="neox", layout="sbhd", out=None, ids=None, offsets=None,
             cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None, stream=None, range_status=None):
    return _apply(1, cache, [dy], [out], ["dy", "out"], style, layout, ids, offsets, cu_seqlens,
                  cp_size, cp_rank, dtype, stream, range_status)[0]


def _pair(out):
    if out is None:
        return None, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a pair (q_out, k_out); None in it means in place")
    return out


def forward_qk(cache, q, k, *, style="neox", layout="sbhd", out=None, ids=None, offsets=None,
               cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None, stream=None,
               range_status=None):
    qo, ko = _pair(out)
    return tuple(_apply(2, cache, [q, k], [qo, ko], ["q", "out[0]", "k", "out[1]"], style,
                        layout, ids, offsets, cu_seqlens, cp_size, cp_rank, dtype, stream,
                        range_status))


def backward_qk(cache, dq, dk, *, style="neox", layout="sbhd", out=None, ids=None, offsets=None,
                cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None, stream=None,
                range_status=None):
    qo, ko = _pair(out)
    return tuple(_apply(3, cache, [dq, dk], [qo, ko], ["dq", "out[0]", "dk", "out[1]"], style,
                        layout, ids, offsets, cu_seqlens, cp_size, cp_rank, dtype, stream,
                        range_status))


forward.__doc__ = "Rotates x (fusedrope_forward); returns the output array." + _DOC
backward.__doc__ = "Gradient of forward: dy -> dx (fusedrope_backward); returns dx." + _DOC
forward_qk.__doc__ = ("Rotates q and k in one pass (fusedrope_forward_qk; GQA head counts);"
                      " returns (q_out, k_out)." + _DOC)
backward_qk.__doc__ = ("Gradient of forward_qk: (dq_out, dk_out) -> (dq_in, dk_in)"
                       " (fusedrope_backward_qk)." + _DOC)


# ------------------------------------------------------------ fused norm

_NORM_WEIGHTS = {"none": 0, "w": 1, "1+w": 2}
_NORM_ROUNDINGS = {"once": 0, "llama": 1, "gemma": 2}


def _norm_spec(weight, rounding, eps, saved_output, q_weight, k_weight, rstd, dweight):
    if weight is None:
        weight = "w" if q_weight is not None or k_weight is not None else "none"
    if weight not in _NORM_WEIGHTS:
        raise ValueError(f"weight must be 'w', '1+w', 'none' or None, not {weight!r}")
    if rounding not in _NORM_ROUNDINGS:
        raise ValueError(f"rounding must be 'once', 'llama' or 'gemma', not {rounding!r}")
    rq, rk = _pair_or_none(rstd, "rstd")
    gq, gk = _pair_or_none(dweight, "dweight")
    extra = [(q_weight, "q_weight"), (k_weight, "k_weight"), (rq, "rstd[0]"), (rk, "rstd[1]"),
             (gq, "dweight[0]"), (gk, "dweight[1]")]
    return (_NORM_WEIGHTS[weight], _NORM_ROUNDINGS[rounding], _real(eps, "eps"),
            bool(saved_output)), extra


def _pair_or_none(p, what):
    if p is None:
        return None, None
    if not isinstance(p, (tuple, list)) or len(p) != 2:
        raise TypeError(f"{what} must be a pair (for q, for k); None in it for none")
    return p


def _norm(op, cache, arrays, names, head, extra, style, layout, ids, offsets, cu_seqlens,
          cp_size, cp_rank, dtype, stream, range_status):
    if arrays[0] is None or arrays[1] is None:
        raise TypeError(f"{names[0] if arrays[0] is None else names[1]} is None; an array is "
                        "needed")
    caps, extra_caps, pos, bf16, s, ctx = _prepare(cache, arrays, names, style, layout, ids,
                                                   offsets, cu_seqlens, dtype, stream,
                                                   range_status, extra)
    with ctx:
        _fusedrope.norm(cache._h, op, _STYLES[style], _LAYOUTS[layout], bf16, caps, *pos[:3],
                        _cint(cp_size, "cp_size"), _cint(cp_rank, "cp_rank"), s, pos[3],
                        tuple(head) + tuple(extra_caps))


def norm_forward_qk(cache, q, k=None, q_weight=None, k_weight=None, *, weight=None,
                    rounding="once", eps=1e-6, rstd=None, style="neox", layout="sbhd", out=None,
                    ids=None, offsets=None, cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None,
                    stream=None, range_status=None):
    if k is None and k_weight is not None:
        raise ValueError("k_weight given without k")
    qo, ko = _pair(out)
    qo = q if qo is None else qo
    ko = k if ko is None else ko
    head, extra = _norm_spec(weight, rounding, eps, False, q_weight, k_weight, rstd, None)
    _norm(0, cache, [q, qo, k, ko], ["q", "out[0]", "k", "out[1]"], head, extra, style, layout,
          ids, offsets, cu_seqlens, cp_size, cp_rank, dtype, stream, range_status)
    _written((qo, ko) + (tuple(rstd) if rstd is not None else ()))
    return qo, ko


def norm_backward_qk(cache, q_saved, dq, k_saved=None, dk=None, q_weight=None, k_weight=None, *,
                     rstd, weight=None, rounding="once", eps=1e-6, saved_output=False,
                     dweight=None, style="neox", layout="sbhd", out=None, ids=None,
                     offsets=None, cu_seqlens=None, cp_size=1, cp_rank=0, dtype=None,
                     stream=None, range_status=None):
    if (k_saved is None) != (dk is None):
        raise ValueError("k_saved and dk go together")
    qo, ko = _pair(out)
    qo = dq if qo is None else qo
    ko = dk if ko is None else ko
    head, extra = _norm_spec(weight, rounding, eps, saved_output, q_weight, k_weight, rstd,
                             dweight)
    _norm(1, cache, [q_saved, dq, qo, k_saved, dk, ko],
          ["q_saved", "dq", "out[0]", "k_saved", "dk", "out[1]"], head, extra, style, layout,
          ids, offsets, cu_seqlens, cp_size, cp_rank, dtype, stream, range_status)
    _written((qo, ko) + (tuple(dweight) if dweight is not None else ()))
    return qo, ko


_NORM_DOC = """
    Per (token, head) row of head_dim channels: rstd = 1/sqrt(mean(x^2) +
    eps) in float32, n = x * rstd, v = n * w' (weight="w": w' = w, Qwen3,
    GLM-4.5; "1+w": w' = 1 + w, Gemma 3, Qwen3.5; "none": w' = 1, Llama 4;
    None: "w" when a weight is given, else "none"), then the RoPE of v.
    rounding: "once" (float32 throughout), "llama" (n rounded to the dtype,
    times w' rounded: Llama/Qwen3's weight * x.to(dtype)) or "gemma" (n * w'
    in float32, rounded once).  q_weight, k_weight: [head_dim] arrays, float32
    or the tensors' dtype.  rstd: a pair of float32 arrays [batch, seq,
    heads] (thd: [tokens, heads]) for q and k (None inside for none): the
    forward writes them, the backward reads them.  k, its weight and its
    rstd may be None (q only).  Semantics, rounding points and dweight's
    reduction order: fusedrope_norm_forward_qk(3).  The other arguments as
    in forward_qk.
"""

norm_forward_qk.__doc__ = ("Fused per-head RMSNorm + RoPE on q and k "
                           "(fusedrope_norm_forward_qk); returns (q_out, k_out)."
                           + _NORM_DOC)
norm_backward_qk.__doc__ = ("Gradient of norm_forward_qk: from the saved inputs (or, with "
                            "saved_output=True, the saved outputs), dq/dk and rstd to "
                            "(dq_in, dk_in) (fusedrope_norm_backward_qk); dweight, a pair "
                            "of float32 [head_dim] arrays, receives the weights' gradients "
                            "(overwritten)." + _NORM_DOC)
