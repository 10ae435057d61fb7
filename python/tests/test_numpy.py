"""NumPy tests of the binding against the float64 reference in ref.py.

Outputs are poisoned (NaN) before out-of-place calls, so an element the
library failed to write shows; failing calls must leave every output byte as
it was.  The seed is printed by assertion messages and can be set with
FUSEDROPE_TEST_SEED.
"""
import ctypes
import itertools
import subprocess
import sys

import numpy as np
import pytest

import fusedrope
import ref

DTYPES = ["float32", "float16", "bfloat16"]
NP_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def cp_pos(j, length, cp_size, cp_rank):
    if cp_size <= 1:
        return j
    chunk = length // 2
    return np.where(j < chunk, cp_rank * chunk + j, (2 * cp_size - 1 - cp_rank) * chunk + j - chunk)


def positions(layout, s, b, ids=None, offsets=None, cu=None, cp_size=1, cp_rank=0):
    """Positions per token: [s, b] (sbhd), [b, s] (bshd) or [t] (thd)."""
    if layout == "thd":
        t = s
        if ids is not None:
            return np.asarray(ids)
        cu = np.asarray(cu if cu is not None else [0, t])
        p = np.empty(t, np.int64)
        for n in range(len(cu) - 1):
            j = np.arange(cu[n + 1] - cu[n])
            p[cu[n]:cu[n + 1]] = cp_pos(j, len(j), cp_size, cp_rank) + (
                0 if offsets is None else offsets[n])
        return p
    if ids is not None:
        p = np.asarray(ids)  # [b, s]
    else:
        p = np.broadcast_to(cp_pos(np.arange(s), s, cp_size, cp_rank), (b, s)).copy()
        if offsets is not None:
            p = p + np.asarray(offsets)[:, None]
    return p.T if layout == "sbhd" else p


def shape_of(layout, s, b, h, d):
    return {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (s, h, d)}[layout]


def cache_and_ref(rot_dim, max_positions=64, theta=10000.0):
    c = fusedrope.Cache("default", rot_dim=rot_dim, max_positions=max_positions, theta=theta)
    inv, a = ref.inv_freq("default", rot_dim, theta, max_positions)
    cos_t, sin_t = ref.table(np.arange(max_positions), inv, a)
    return c, cos_t, sin_t


CASES = list(itertools.product(DTYPES, ["sbhd", "bshd", "thd"], ["neox", "interleaved"]))


@pytest.mark.parametrize("dtype,layout,style", CASES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_single(dtype, layout, style, inplace, backward):
    r = ref.rng(ref.salt(dtype, layout, style, inplace, backward))
    s, b, h, d, rot = 7, 3, 5, 24, 16  # rot_dim < head_dim: the tail is copied/left
    if layout == "thd":
        b = 1
    cache, cos_t, sin_t = cache_and_ref(rot)
    x, xf = ref.make(shape_of(layout, s, b, h, d), dtype, r)
    pos = positions(layout, s, b)
    want, mag = ref.rotate(xf, pos, cos_t, sin_t, rot, style, backward)
    fn = fusedrope.backward if backward else fusedrope.forward
    kw = dict(style=style, layout=layout, dtype="bfloat16" if dtype == "bfloat16" else None)
    if inplace:
        y = x.copy()
        res = fn(cache, y, **kw)
        assert res is y
    else:
        y = np.empty_like(x)
        ref.poison(y, dtype)
        x0 = x.copy()
        res = fn(cache, x, out=y, **kw)
        assert res is y
        assert np.array_equal(x, x0), "the input changed"
    got = ref.to_f64(y, dtype)
    ref.assert_close(got, want, mag, dtype, what=f"{dtype} {layout} {style}")
    # channels past rot_dim: copied exactly (out of place) or untouched (in place)
    assert np.array_equal(got[..., rot:], xf[..., rot:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("backward", [False, True])
def test_qk_gqa_packed_views(dtype, layout, backward):
    """q and k as strided views of one packed QKV buffer (different head
    counts), out of place into another packed buffer's views."""
    r = ref.rng(7)
    s, b, hq, hk, d = 6, 2, 4, 2, 16
    if layout == "thd":
        b = 1
    rows = hq + 2 * hk
    cache, cos_t, sin_t = cache_and_ref(d)
    qkv, qkvf = ref.make(shape_of(layout, s, b, rows, d), dtype, r)
    q, k = qkv[..., :hq, :], qkv[..., hq:hq + hk, :]
    out = np.empty_like(qkv)
    ref.poison(out, dtype)
    qo, ko = out[..., :hq, :], out[..., hq:hq + hk, :]
    pos = positions(layout, s, b)
    fn = fusedrope.backward_qk if backward else fusedrope.forward_qk
    res = fn(cache, q, k, out=(qo, ko), layout=layout,
             dtype="bfloat16" if dtype == "bfloat16" else None)
    assert res[0] is qo and res[1] is ko
    for got, src in ((qo, qkvf[..., :hq, :]), (ko, qkvf[..., hq:hq + hk, :])):
        want, mag = ref.rotate(src, pos, cos_t, sin_t, d, "neox", backward)
        ref.assert_close(ref.to_f64(got, dtype), want, mag, dtype, what="qk")
    # v (past q and k) is not an output: still poisoned
    v = out[..., hq + hk:, :]
    assert (v == ref.BF16_POISON).all() if dtype == "bfloat16" else np.isnan(v).all()


def test_qk_in_place_and_partial_out():
    r = ref.rng(3)
    cache, cos_t, sin_t = cache_and_ref(8)
    q, qf = ref.make((5, 2, 4, 8), "float32", r)
    k, kf = ref.make((5, 2, 1, 8), "float32", r)
    ko = np.full_like(k, np.nan)
    fusedrope.forward_qk(cache, q, k, out=(None, ko))  # q in place, k out of place
    pos = positions("sbhd", 5, 2)
    for got, src in ((q, qf), (ko, kf)):
        want, mag = ref.rotate(src, pos, cos_t, sin_t, 8, "neox")
        ref.assert_close(got.astype(np.float64), want, mag, "float32")
    assert np.array_equal(k, kf.astype(np.float32))


def test_padded_strides():
    """Head and token strides larger than dense (a padded buffer)."""
    r = ref.rng(11)
    cache, cos_t, sin_t = cache_and_ref(8)
    big, bigf = ref.make((9, 3, 4, 12), "float16", r)
    x, xf = big[::2, :, 1:4, 2:10], bigf[::2, :, 1:4, 2:10]   # non-dense, channels contiguous
    out = np.full((5, 3, 3, 8), np.nan, np.float16)[:, :, :, :]
    fusedrope.forward(cache, x, out=out)
    want, mag = ref.rotate(xf, positions("sbhd", 5, 3), cos_t, sin_t, 8, "neox")
    ref.assert_close(out.astype(np.float64), want, mag, "float16")
    before = big.copy()
    fusedrope.forward(cache, x)                     # in place on the view
    ref.assert_close(x.astype(np.float64), want, mag, "float16")
    mask = np.ones(big.shape, bool)
    mask[::2, :, 1:4, 2:10] = False
    assert np.array_equal(big[mask], before[mask]), "bytes outside the view changed"


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_ids_and_offsets(layout):
    r = ref.rng(5)
    s, b, h, d, P = 4, 3, 2, 8, 50
    cache, cos_t, sin_t = cache_and_ref(d, P)
    x, xf = ref.make(shape_of(layout, s, b, h, d), "float32", r)
    ids = r.integers(0, P, size=(b, s)).astype(np.int64)
    y = np.full_like(x, np.nan)
    fusedrope.forward(cache, x, out=y, layout=layout, ids=ids)
    want, mag = ref.rotate(xf, positions(layout, s, b, ids=ids), cos_t, sin_t, d, "neox")
    ref.assert_close(y.astype(np.float64), want, mag, "float32", what="ids")

    offsets = np.array([0, 17, 45], np.int64)
    y[...] = np.nan
    fusedrope.forward(cache, x, out=y, layout=layout, offsets=offsets)
    want, mag = ref.rotate(xf, positions(layout, s, b, offsets=offsets), cos_t, sin_t, d, "neox")
    ref.assert_close(y.astype(np.float64), want, mag, "float32", what="offsets")
    # lists are accepted on a CPU cache
    y2 = np.full_like(x, np.nan)
    fusedrope.forward(cache, x, out=y2, layout=layout, offsets=[0, 17, 45])
    assert np.array_equal(y, y2)


@pytest.mark.parametrize("cp_size,cp_rank", [(1, 0), (2, 0), (2, 1), (3, 2)])
def test_thd_cu_seqlens_cp_offsets(cp_size, cp_rank):
    r = ref.rng(13)
    cu = np.array([0, 4, 4, 10, 12], np.int32)  # an empty sequence too; even lengths for cp
    t, h, d = 12, 3, 8
    cache, cos_t, sin_t = cache_and_ref(d, 128)
    offsets = np.array([3, 0, 9, 1], np.int64)
    for offs in (None, offsets):
        x, xf = ref.make((t, h, d), "bfloat16", r)
        y = np.full_like(x, ref.BF16_POISON)
        fusedrope.forward(cache, x, out=y, layout="thd", cu_seqlens=cu, offsets=offs,
                          cp_size=cp_size, cp_rank=cp_rank, dtype="bfloat16")
        pos = positions("thd", t, 1, offsets=offs, cu=cu, cp_size=cp_size, cp_rank=cp_rank)
        want, mag = ref.rotate(xf, pos, cos_t, sin_t, d, "neox")
        ref.assert_close(ref.to_f64(y, "bfloat16"), want, mag, "bfloat16", what="thd cp")


def test_sbhd_cp():
    r = ref.rng(17)
    s, b, h, d = 8, 2, 2, 8
    cache, cos_t, sin_t = cache_and_ref(d)
    x, xf = ref.make((s, b, h, d), "float32", r)
    fusedrope.forward(cache, x, cp_size=2, cp_rank=1)
    want, mag = ref.rotate(xf, positions("sbhd", s, b, cp_size=2, cp_rank=1), cos_t, sin_t, d,
                           "neox")
    ref.assert_close(x.astype(np.float64), want, mag, "float32")


def test_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    r = ref.rng(19)
    cache, cos_t, sin_t = cache_and_ref(8)
    bits, xf = ref.make((3, 2, 2, 8), "bfloat16", r)
    x = bits.view(ml_dtypes.bfloat16)
    y = np.zeros_like(x)
    fusedrope.forward(cache, x, out=y)           # no dtype= needed
    want, mag = ref.rotate(xf, positions("sbhd", 3, 2), cos_t, sin_t, 8, "neox")
    ref.assert_close(y.astype(np.float64), want, mag, "bfloat16")
    # 16-bit integers beside it are not taken as bfloat16 without dtype=
    for dt in (np.int16, np.uint16):
        out = np.full(x.shape, 0x7fff, dt)
        with pytest.raises(TypeError, match="dtype='bfloat16'"):
            fusedrope.forward(cache, x, out=out)
        assert (out == 0x7fff).all()
    out = np.zeros(x.shape, np.uint16)
    fusedrope.forward(cache, x, out=out, dtype="bfloat16")
    assert (out == y.view(np.uint16)).all()


# ------------------------------------------------------------------ caches

FIVE = [
    ("default", dict(theta=10000.0)),
    ("linear", dict(theta=10000.0, factor=4.0)),
    ("dynamic", dict(theta=10000.0, factor=2.0, original_max_positions=512, seq_len=3000)),
    ("yarn", dict(theta=150000.0, factor=32.0, original_max_positions=4096, truncate=False)),
    ("yarn", dict(theta=1e6, factor=4.0, original_max_positions=32768, mscale=0.707,
                  mscale_all_dim=0.707 * 2)),
    ("longrope", dict(theta=10000.0, original_max_positions=512)),
    ("llama3", dict(theta=500000.0, factor=8.0, original_max_positions=8192,
                    low_freq_factor=1.0, high_freq_factor=4.0)),
]


@pytest.mark.parametrize("type,params", FIVE)
@pytest.mark.parametrize("max_positions", [300, 4096])
def test_cache_table(type, params, max_positions):
    d = 64
    params = dict(params)
    if type == "longrope":
        r = ref.rng(23)
        params["short_factor"] = list(1.0 + r.random(d // 2))
        params["long_factor"] = list(1.0 + 20 * r.random(d // 2))
    cache = fusedrope.Cache(type, rot_dim=d, max_positions=max_positions, **params)
    assert cache.rot_dim == d and cache.max_positions == max_positions
    assert cache.device == "cpu" and cache.type == type
    cos, sin = cache.table()
    assert cos.shape == (max_positions, d // 2) and cos.dtype == np.float32
    inv, a = ref.inv_freq(type, d, max_positions=max_positions, **params)
    rc, rs = ref.table(np.arange(max_positions), inv, a)
    # rounded once from double to float32: within one float32 ulp
    for got, want in ((cos, rc), (sin, rs)):
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= ref.ulp(want, "float32")).all(), f"{type}: max err {err.max()}"


def test_cache_large_positions_double_angles():
    """Angles formed in double: exact at p = 131071 (DESIGN)."""
    cache = fusedrope.Cache("llama3", rot_dim=128, max_positions=131072, theta=500000.0,
                            factor=8.0, original_max_positions=8192)
    cos, sin = cache.table()
    inv, a = ref.inv_freq("llama3", 128, 500000.0, 131072, factor=8.0,
                          original_max_positions=8192)
    p = np.array([65537, 100003, 131071])
    rc, rs = ref.table(p, inv, a)
    assert (np.abs(cos[p] - rc) <= ref.ulp(rc, "float32")).all()
    assert (np.abs(sin[p] - rs) <= ref.ulp(rs, "float32")).all()


def test_from_table_roundtrip_and_apply():
    r = ref.rng(29)
    cos = r.standard_normal((10, 4)).astype(np.float32)
    sin = r.standard_normal((10, 4)).astype(np.float32)
    cache = fusedrope.Cache.from_table(cos, sin)
    assert cache.rot_dim == 8 and cache.max_positions == 10 and cache.type is None
    c2, s2 = cache.table()
    assert np.array_equal(c2, cos) and np.array_equal(s2, sin)
    x, xf = ref.make((10, 1, 2, 8), "float32", r)
    fusedrope.forward(cache, x, style="interleaved")
    want, mag = ref.rotate(xf, positions("sbhd", 10, 1), cos.astype(np.float64),
                           sin.astype(np.float64), 8, "interleaved")
    # the attention-factor term: table entries here are up to ~4 in magnitude
    ref.assert_close(x.astype(np.float64), want, mag, "float32",
                     attn=float(np.abs(np.concatenate([cos, sin])).max()) * 2)
    with pytest.raises(ValueError):
        fusedrope.Cache.from_table(cos, sin[:, :3])


def test_no_table_cache():
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=0)
    with pytest.raises(ValueError, match="no table"):
        cache.table()
    x = np.ones((2, 1, 1, 8), np.float32)
    fusedrope.forward(cache, x, ids=np.array([[0, 10**9]], np.int64))  # any position >= 0
    assert np.isfinite(x).all()


# -------------------------------------------------------------- bad input

def poisoned_pair(shape=(4, 2, 3, 8), dtype=np.float32):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape).astype(dtype)
    y = np.full(shape, 7, dtype)
    return x, y


def unchanged(*arrays):
    saved = [a.copy() for a in arrays]

    def check():
        for a, s in zip(arrays, saved):
            assert np.array_equal(a, s, equal_nan=True), "a failing call wrote something"
    return check


@pytest.fixture
def cache8():
    return fusedrope.Cache("default", rot_dim=8, max_positions=16)


def test_error_carries_status_and_sentence(cache8):
    x, y = poisoned_pair()
    y = y[:, :1]  # batch differs
    check = unchanged(x, y)
    with pytest.raises(fusedrope.Error) as e:
        fusedrope.forward(cache8, x, out=y)
    assert e.value.status == 1 and e.value.status_name == "ERR_INVALID"
    assert e.value.detail and e.value.detail in str(e.value)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError)
    check()


def test_error_class_after_the_package_runs_again():
    """A package run again (imported after its modules left sys.modules, or
    importlib.reload) defines Error again, while the extension, loaded once a
    process, raises one class: every copy must name that same class, so each
    copy's `except fusedrope.Error` catches the library's errors.  In a child
    process: the reload would leave this session's fixtures' Cache class
    behind."""
    code = r"""
import importlib, sys
import numpy as np
import fusedrope as a
first = a.Error
for name in [m for m in sys.modules if m == "fusedrope" or m.startswith("fusedrope.")]:
    del sys.modules[name]
import fusedrope as b
assert b is not a and b.Error is first, (b.Error, first)
importlib.reload(b)
assert b.Error is first, (b.Error, first)
for mod in (a, b):
    x = np.zeros((17, 1, 1, 8), np.float32)              # positions 0..16, the table 16
    try:
        mod.forward(mod.Cache("default", rot_dim=8, max_positions=16), x)
    except first as e:
        assert e.status_name == "ERR_RANGE", e
    else:
        raise AssertionError("no error")
print("same class")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "same class\n", r.stdout + r.stderr


def test_bad_cache_arguments():
    with pytest.raises(fusedrope.Error, match="rot_dim") as e:
        fusedrope.Cache("default", rot_dim=9, max_positions=16)
    assert e.value.status_name == "ERR_INVALID"
    with pytest.raises(fusedrope.Error) as e:
        fusedrope.Cache("yarn", rot_dim=8, max_positions=16)   # original_max_positions unset
    assert "original_max_positions" in e.value.detail
    with pytest.raises(ValueError, match="type"):
        fusedrope.Cache("ntk", rot_dim=8, max_positions=16)
    with pytest.raises(TypeError):
        fusedrope.Cache("default", rot_dim=8)
    with pytest.raises(ValueError, match="entries"):
        fusedrope.Cache("longrope", rot_dim=8, max_positions=16, original_max_positions=4,
                        short_factor=[1.0] * 3, long_factor=[1.0] * 4)
    with pytest.raises(ValueError, match="device"):
        fusedrope.Cache("default", rot_dim=8, max_positions=16, device="tpu")
    # numbers as numbers: a string is not parsed, nor taken as true
    with pytest.raises(TypeError, match="theta"):
        fusedrope.Cache("default", rot_dim=8, max_positions=16, theta="1e4")
    with pytest.raises(TypeError, match="truncate"):
        fusedrope.Cache("yarn", rot_dim=8, max_positions=16, factor=2.0,
                        original_max_positions=8, truncate="no")
    with pytest.raises(TypeError, match="short_factor"):
        fusedrope.Cache("longrope", rot_dim=8, max_positions=16, original_max_positions=4,
                        short_factor=["1"] * 4, long_factor=[1.0] * 4)
    c = fusedrope.Cache("yarn", rot_dim=8, max_positions=16, factor=2.0,
                        original_max_positions=8, truncate=np.False_)
    assert c.params["truncate"] is False
    # past the C argument's range: ValueError, not OverflowError
    with pytest.raises(ValueError, match="rot_dim"):
        fusedrope.Cache("default", rot_dim=2**33, max_positions=16)
    with pytest.raises(ValueError, match="max_positions"):
        fusedrope.Cache("default", rot_dim=8, max_positions=2**64)
    with pytest.raises(ValueError, match="num_threads"):
        fusedrope.Cache("default", rot_dim=8, max_positions=16, num_threads=2**40)
    with pytest.raises(ValueError, match="freq_dim"):
        fusedrope.Cache("default", rot_dim=8, max_positions=16, freq_dim=2**70)
    with pytest.raises(ValueError, match="original_max_positions"):
        fusedrope.Cache("yarn", rot_dim=8, max_positions=16, factor=2.0,
                        original_max_positions=2**70)


def test_cu_seqlens_list_past_int32():
    """A list's values must fit the int32 cu_seqlens (2^32 + 3 once wrapped to
    3 and was accepted)."""
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    x = np.ones((7, 1, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        fusedrope.forward(cache, x, layout="thd", cu_seqlens=[0, 2**32 + 3, 7])


def test_cache_copies_are_the_cache():
    """A cache never changes: copy.copy and copy.deepcopy give the cache
    itself (a module holding one deep-copies), usable by fusedrope.torch
    after the name it came from is gone."""
    import copy
    c = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    assert copy.copy(c) is c and copy.deepcopy([c])[0] is c
    c2 = copy.copy(c)
    del c
    x = np.ones((2, 1, 1, 8), np.float32)
    fusedrope.forward(c2, x)


def test_from_config_needs_a_config():
    for bad in ("config.json", None, 3):
        with pytest.raises(TypeError, match="config must be"):
            fusedrope.Cache.from_config(bad)


@pytest.mark.skipif(fusedrope.cuda_available(), reason="a CUDA device is present")
def test_cuda_cache_without_device():
    with pytest.raises(fusedrope.Error) as e:
        fusedrope.Cache("default", rot_dim=8, max_positions=16, device="cuda:0")
    assert e.value.status_name == "ERR_UNSUPPORTED"


def test_non_contiguous_channels(cache8):
    x, y = poisoned_pair((4, 2, 3, 16))
    check = unchanged(x, y)
    with pytest.raises(ValueError, match="contiguous"):
        fusedrope.forward(cache8, x[..., ::2], out=y[..., :8])
    with pytest.raises(ValueError, match="contiguous"):
        fusedrope.forward(cache8, x[..., :8], out=y[..., ::2])
    with pytest.raises(ValueError, match="contiguous"):
        fusedrope.forward(cache8, np.asfortranarray(x))
    check()


@pytest.mark.parametrize("dt", [np.float64, np.int32, np.uint16, np.int8])
def test_wrong_dtype(cache8, dt):
    x = np.ones((4, 2, 3, 8), dt)
    check = unchanged(x)
    with pytest.raises(TypeError, match="dtype"):
        fusedrope.forward(cache8, x)
    check()


def test_dtype_argument(cache8):
    x = np.ones((4, 2, 3, 8), np.float16)
    with pytest.raises(TypeError, match="float32"):
        fusedrope.forward(cache8, x, dtype="float32")
    with pytest.raises(TypeError):
        fusedrope.forward(cache8, x, dtype="bfloat16")   # float16 is not bfloat16 bits
    with pytest.raises(ValueError):
        fusedrope.forward(cache8, x, dtype="float64")


def test_mismatches(cache8):
    x, y = poisoned_pair()
    check = unchanged(x, y)
    for out in (y[:3], y[:, :, :2], y.astype(np.float16), np.full((4, 2, 3, 10), 7, np.float32)):
        with pytest.raises(fusedrope.Error):
            fusedrope.forward(cache8, x, out=out)
    with pytest.raises(ValueError, match="dimensions"):
        fusedrope.forward(cache8, x, layout="thd")
    with pytest.raises(ValueError, match="layout"):
        fusedrope.forward(cache8, x, layout="bhsd")
    with pytest.raises(ValueError, match="style"):
        fusedrope.forward(cache8, x, style="gptj")
    with pytest.raises(fusedrope.Error):                  # head_dim < rot_dim
        fusedrope.forward(cache8, np.ones((4, 2, 3, 6), np.float32))
    with pytest.raises(fusedrope.Error):                  # partial overlap, not in place
        fusedrope.forward(cache8, x[1:], out=x[:-1])
    with pytest.raises(TypeError, match="pair"):
        fusedrope.forward_qk(cache8, x, x.copy(), out=y)
    with pytest.raises(TypeError, match="DLPack"):
        fusedrope.forward(cache8, [[1.0]])
    with pytest.raises(TypeError, match="Cache"):
        fusedrope.forward(None, x)
    check()
    ro = np.ones((4, 2, 3, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        fusedrope.forward(cache8, ro)
    assert (ro == 1).all()


def test_empty_arrays(cache8):
    """Arrays without elements (NumPy exports them with zero strides) are
    empty tensors, which the library accepts with nothing to do."""
    x = np.ones((0, 2, 8), np.float32)
    assert fusedrope.forward(cache8, x, layout="thd", cu_seqlens=[0, 0]).shape == (0, 2, 8)
    q, k = np.ones((4, 2, 3, 8), np.float32), np.ones((4, 2, 0, 8), np.float32)
    qo, ko = fusedrope.forward_qk(cache8, q, k, out=(np.empty_like(q), np.empty_like(k)))
    assert np.isfinite(qo).all() and ko.shape == (4, 2, 0, 8)
    r = np.ones((0, 2), np.float32)
    fusedrope.norm_forward_qk(cache8, x, layout="thd", cu_seqlens=[0, 0], rstd=(r, None))


def test_argument_messages(cache8):
    x = np.ones((4, 2, 3, 8), np.float32)
    with pytest.raises(TypeError, match="x is None"):
        fusedrope.forward(cache8, None)
    with pytest.raises(TypeError, match="k is None"):
        fusedrope.forward_qk(cache8, x, None)
    with pytest.raises(TypeError, match="q is None"):
        fusedrope.norm_forward_qk(cache8, None)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only.*in place"):
        fusedrope.forward(cache8, ro)
    with pytest.raises(TypeError, match="same dtype"):   # float32 among bfloat16 arrays
        fusedrope.forward(cache8, x, out=np.empty(x.shape, np.uint16), dtype="bfloat16")
    rec = np.zeros((4, 2, 3, 8), dtype=[("a", np.float32), ("b", np.int8)])["a"]
    with pytest.raises(ValueError, match="DLPack"):     # byte stride 5: NumPy cannot export it
        fusedrope.forward(cache8, rec, out=np.empty((4, 2, 3, 8), np.float32))
    with pytest.raises(TypeError, match="integers"):    # positions are never truncated
        fusedrope.forward(cache8, x, out=np.empty_like(x), ids=[[0.9, 1.9, 2, 3]] * 2,
                          layout="bshd")
    for bad in (8.7, "8"):
        with pytest.raises(TypeError, match="rot_dim must be an int"):
            fusedrope.Cache("default", rot_dim=bad, max_positions=16)
    with pytest.raises(TypeError, match="max_positions must be an int"):
        fusedrope.Cache("default", rot_dim=8, max_positions=16.9)
    assert fusedrope.Cache("default", rot_dim=np.int64(8), max_positions=16).rot_dim == 8


def test_bad_positions(cache8):
    x, y = poisoned_pair()        # s=4, b=2
    check = unchanged(x, y)
    bad = [
        dict(ids=np.zeros((4, 2), np.int64)),            # [s, b] instead of [b, s]
        dict(ids=np.zeros(8, np.int64)),
        dict(ids=np.zeros((2, 4), np.int32)),
        dict(offsets=np.zeros(3, np.int64)),
        dict(offsets=np.zeros((2, 1), np.int64)),
        dict(cu_seqlens=np.array([0, 4], np.int32)),     # sbhd
        dict(ids="0123"),
    ]
    for kw in bad:
        with pytest.raises((ValueError, TypeError)):
            fusedrope.forward(cache8, x, out=y, **kw)
    # the exceptions the docs name, not an IndexError or OverflowError
    with pytest.raises(ValueError, match="shape"):
        fusedrope.forward(cache8, x, out=y, ids=np.zeros((0, 2, 4), np.int64))
    with pytest.raises(TypeError, match="cp_size"):
        fusedrope.forward(cache8, x, out=y, cp_size=1.9)
    with pytest.raises(ValueError, match="cp_size"):
        fusedrope.forward(cache8, x, out=y, cp_size=2**40)
    with pytest.raises(ValueError, match="cp_rank"):
        fusedrope.forward_qk(cache8, x, x.copy(), out=(y, None), cp_rank=-2**40)
    # ids not compact are copied compact (not refused)
    wide = np.arange(16, dtype=np.int64).reshape(2, 8) % 16
    got = fusedrope.forward(cache8, x, out=np.empty_like(x), ids=wide[:, ::2])
    assert np.array_equal(got, fusedrope.forward(cache8, x, out=np.empty_like(x),
                                                 ids=np.ascontiguousarray(wide[:, ::2])))
    for kw in (dict(ids=np.full((2, 4), 16, np.int64)),            # outside the table
               dict(offsets=np.array([0, 13], np.int64)),
               dict(ids=np.zeros((2, 4), np.int64), offsets=np.zeros(2, np.int64)),
               dict(cp_size=2, cp_rank=2)):
        with pytest.raises(fusedrope.Error):
            fusedrope.forward(cache8, x, out=y, **kw)
    with pytest.raises(fusedrope.Error) as e:
        fusedrope.forward(cache8, x, out=y, ids=np.full((2, 4), 16, np.int64))
    assert e.value.status_name == "ERR_RANGE"
    t = np.ones((6, 2, 8), np.float32)
    check_t = unchanged(t)
    for cu in (np.array([0, 4, 5], np.int32), np.array([0, 6], np.int64), np.array([1, 6], np.int32),
               np.array([0], np.int32), np.array([[0, 6]], np.int32)):
        with pytest.raises((ValueError, TypeError, fusedrope.Error)):
            fusedrope.forward(cache8, t, layout="thd", cu_seqlens=cu)
    with pytest.raises(ValueError, match="one per sequence"):
        fusedrope.forward(cache8, t, layout="thd", cu_seqlens=np.array([0, 2, 6], np.int32),
                          offsets=np.zeros(3, np.int64))
    check()
    check_t()


# -------------------------------------------- a CUDA array on a CPU cache

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


def _capsule(struct, name):
    """A PyCapsule `name` of a ctypes DLPack struct's address, without a
    destructor: the producer object that holds the struct keeps it alive."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(struct), name, None)


class FakeCudaArray:
    """A DLPack producer claiming CUDA memory (its pointer is never valid):
    the binding must refuse it on a CPU cache before the library sees it."""

    def __init__(self, shape, device_type=2):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.m = _DLManagedTensor()
        self.m.dl_tensor = _DLTensor(0xDEAD000, _DLDevice(device_type, 0), len(shape),
                                     _DLDataType(2, 32, 1), self.shape, None, 0)
        self.streams = []

    def __dlpack_device__(self):
        return (self.m.dl_tensor.device.device_type, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _capsule(self.m, b"dltensor")


def test_cuda_array_on_cpu_cache(cache8):
    fake = FakeCudaArray((4, 2, 3, 8))
    with pytest.raises(ValueError, match="cuda:0 but the cache is on the CPU"):
        fusedrope.forward(cache8, fake)
    assert fake.streams == [1]   # DLPack's legacy default stream, never 0
    x = np.ones((4, 2, 3, 8), np.float32)
    check = unchanged(x)
    with pytest.raises(ValueError, match="cache is on the CPU"):
        fusedrope.forward(cache8, x, out=FakeCudaArray((4, 2, 3, 8)))
    with pytest.raises(ValueError, match="cache is on the CPU"):
        fusedrope.forward(cache8, FakeCudaArray((4, 2, 3, 8), device_type=99))
    # positions are checked alike: ids in CUDA memory, before their dtype
    with pytest.raises(ValueError, match="ids is on cuda:0 but the cache is on the CPU"):
        fusedrope.forward(cache8, x, out=np.empty_like(x), ids=FakeCudaArray((2, 4)))
    check()


class HostIds:
    """A DLPack producer of host int64 positions with the strides it is
    given (in elements), as a third-party array library may export them:
    NumPy and PyTorch host ids are made compact before the binding sees
    them, these are not."""

    def __init__(self, a, shape, strides):
        self.a = a
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(strides))(*strides)
        self.m = _DLManagedTensor()
        self.m.dl_tensor = _DLTensor(a.ctypes.data, _DLDevice(1, 0), len(shape),
                                     _DLDataType(0, 64, 1), self.shape, self.strides, 0)

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        return _capsule(self.m, b"dltensor")


def test_host_ids_strided_within_a_row(cache8):
    """The binding reads a row of ids ([batch, seq]) as compact: a
    producer's ids with a step inside it are refused, compact ones taken."""
    x = np.ones((4, 2, 3, 8), np.float32)
    y = np.full_like(x, np.nan)
    check = unchanged(x, y)
    buf = np.arange(16, dtype=np.int64)
    for strides in ((8, 2), (8, 1)):   # a step within seq; batch entries apart
        with pytest.raises(ValueError, match="must be contiguous within a row"):
            fusedrope.forward(cache8, x, out=y, ids=HostIds(buf, (2, 4), strides))
    check()
    fusedrope.forward(cache8, x, out=y, ids=HostIds(buf, (2, 4), (4, 1)))
    want = np.full_like(x, np.nan)
    fusedrope.forward(cache8, x, out=want, ids=buf[:8].reshape(2, 4))
    assert np.array_equal(y, want) and not np.isnan(y).any()


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class CopyingExporter:
    """A DLPack 1.0 producer that exports a copy of its float32 array (flag
    IS_COPIED, which DLPack allows unless the consumer passes copy=False):
    readable, but what is written there never reaches the array."""

    def __init__(self, a):
        self.a, self.copy = a, a.copy()
        self.shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        self.m = _DLManagedTensorVersioned(1, 0, None, None, 2, _DLTensor(
            self.copy.ctypes.data, _DLDevice(1, 0), a.ndim, _DLDataType(2, 32, 1), self.shape,
            None, 0))

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, max_version=None, copy=None):
        assert max_version is not None and max_version[0] >= 1
        return _capsule(self.m, b"dltensor_versioned")


def test_output_exported_as_a_copy(cache8):
    """An output the producer exported as a copy is refused (the results
    would be lost); such an input is read as any other."""
    x = ref.rng(37).uniform(-1, 1, (4, 2, 3, 8)).astype(np.float32)
    y = np.empty_like(x)
    check = unchanged(x)
    for call in (lambda: fusedrope.forward(cache8, x, out=CopyingExporter(y)),
                 lambda: fusedrope.forward(cache8, CopyingExporter(x.copy())),   # in place
                 lambda: fusedrope.norm_forward_qk(cache8, x, out=(y, None), rstd=(
                     CopyingExporter(np.empty((4, 2, 3), np.float32)), None))):
        with pytest.raises(ValueError, match="copy of its memory.*lost"):
            call()
    check()
    fusedrope.forward(cache8, CopyingExporter(x), out=y)
    assert np.array_equal(y, fusedrope.forward(cache8, x, out=np.empty_like(x)))


def test_export_stream():
    """The stream a CUDA array's export names: DLPack's -1 (no
    synchronisation) only for PyTorch tensors on PyTorch's current stream,
    whose work is ordered already; the call's stream otherwise, 1 for 0."""
    torch_like = type("Tensor", (), {"__module__": "torch"})()
    cupy_like = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert fusedrope._export_stream(torch_like, 0x1234, True) == -1
    assert fusedrope._export_stream(torch_like, 0x1234, False) == 0x1234
    assert fusedrope._export_stream(cupy_like, 0x1234, True) == 0x1234
    assert fusedrope._export_stream(cupy_like, 0, False) == 1
    assert fusedrope._export_stream(torch_like, 0, False) == 1


def test_version():
    v, n = fusedrope.version()
    assert v == fusedrope.__version__ and n == fusedrope._fusedrope.HEADER_VERSION_NUMBER
