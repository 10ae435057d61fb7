"""NumPy tests of position axes (multimodal rope), the proportional rope
type, freq_dim and LongRoPE by seq_len, against a float64 reference written
here from the formulas of fusedrope.h (fusedrope_axes):

    angle_j = p[axis(j)] * inv[col(j)],   inv[c] = theta^(-2c/F) (F = freq_dim)

SECTIONS: contiguous s[0] pairs on axis 0, the next s[1] on axis 1, ...;
INTERLEAVED: axis 1 if j%3 == 1 and j < 3 s[1], axis 2 if j%3 == 2 and
j < 3 s[2], else 0; ALTERNATING: j < 2 s[1]: axis 1 for even j, 2 for odd;
VISION_2D: j < rot/4: (axis 0, col j), else (axis 1, col j - rot/4), with
F = rot/2; CUSTOM: pair_axis[j], pair_col[j].  Seeds: FUSEDROPE_TEST_SEED.
"""
import math

import numpy as np
import pytest

import fusedrope
import ref

P = 97  # table rows: positions are drawn below it


# ------------------------------------------------------------ the reference

def layout_map(axes, n, sections=None, pair_axis=None, pair_col=None):
    """(axis[j], col[j]) for the n = rot_dim/2 pairs."""
    j = np.arange(n)
    s = list(sections or []) + [0] * 4
    if axes == "sections":
        axis = np.repeat(np.arange(4), s[:4])
        assert len(axis) == n
        return axis, j
    if axes == "interleaved":
        axis = np.where((j % 3 == 1) & (j < 3 * s[1]), 1,
                        np.where((j % 3 == 2) & (j < 3 * s[2]), 2, 0))
        return axis, j
    if axes == "alternating":
        return np.where(j < 2 * s[1], np.where(j % 2 == 0, 1, 2), 0), j
    if axes == "vision_2d":
        q = n // 2
        return np.where(j < q, 0, 1), np.where(j < q, j, j - q)
    if axes == "custom":
        return np.asarray(pair_axis), (j if pair_col is None else np.asarray(pair_col))
    raise ValueError(axes)


def default_inv(rot, theta, F=None):
    F = F or rot
    return theta ** (-2.0 * np.arange(rot // 2) / F)


def rotate_angles(x, ang, rot, style, backward=False):
    """x float64 [tokens..., heads, d]; ang float64 [tokens..., rot/2]."""
    y = x.copy()
    c, s = np.cos(ang)[..., None, :], np.sin(ang)[..., None, :]
    if backward:
        s = -s
    half = rot // 2
    if style == "neox":
        ia, ib = np.arange(half), np.arange(half) + half
    else:
        ia, ib = np.arange(0, rot, 2), np.arange(1, rot, 2)
    a, b = x[..., ia], x[..., ib]
    y[..., ia] = a * c - b * s
    y[..., ib] = b * c + a * s
    mag = np.zeros_like(x)
    mag[..., ia] = mag[..., ib] = np.abs(a) + np.abs(b)
    return y, mag


def angles(pos_rows, axis, col, inv):
    """pos_rows: [axes, tokens...] positions -> [tokens..., n] angles."""
    p = np.asarray(pos_rows, np.float64)
    return np.stack([p[axis[j]] * inv[col[j]] for j in range(len(axis))], -1)


def token_rows(ids, layout):
    """ids [axes, batch, seq] (or [axes, tokens]) -> positions per token in
    the tensor's own order: [axes, s, b] (sbhd), [axes, b, s], [axes, t]."""
    return np.swapaxes(ids, 1, 2) if layout == "sbhd" else ids


def shape_of(layout, s, b, h, d):
    return {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (s, h, d)}[layout]


def unchanged(*arrays):
    saved = [a.copy() for a in arrays]

    def check():
        for a, s in zip(arrays, saved):
            assert np.array_equal(a, s, equal_nan=True), "a failing call wrote something"
    return check


# ----------------------------------------------------------- layouts, apply

ROT = 24  # 12 pairs
LAYOUTS = [
    ("sections", dict(sections=[2, 5, 5]), 3),
    ("sections", dict(sections=[3, 3, 3, 3]), 4),
    ("interleaved", dict(sections=[6, 3, 3]), 3),
    ("alternating", dict(sections=[6, 3, 3]), 3),
    ("vision_2d", dict(), 2),
    ("custom", dict(pair_axis=[3, 0, 1, 2, 1, 0, 0, 2, 3, 1, 0, 0],
                    pair_col=[0, 0, 11, 4, 4, 7, 1, 2, 9, 3, 5, 6]), 4),
]


@pytest.mark.parametrize("axes,kw,rows", LAYOUTS, ids=[f"{a}-{r}" for a, _, r in LAYOUTS])
@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("dtype,backward", [("float32", False), ("bfloat16", True),
                                            ("float16", False)])
def test_axes_against_reference(axes, kw, rows, layout, style, dtype, backward):
    r = ref.rng(ref.salt(axes, rows, layout, style, dtype))
    s, b, h, d = 7, 2, 3, ROT + 6   # channels past rot_dim: copied
    if layout == "thd":
        b = 1
    theta = 10000.0
    cache = fusedrope.Cache("default", rot_dim=ROT, max_positions=P, theta=theta, axes=axes, **kw)
    axis, col = layout_map(axes, ROT // 2, **kw)
    inv = default_inv(ROT, theta, ROT // 2 if axes == "vision_2d" else None)
    ids = r.integers(0, P, size=(rows, s) if layout == "thd" else (rows, b, s)).astype(np.int64)
    x, xf = ref.make(shape_of(layout, s, b, h, d), dtype, r)
    want, mag = rotate_angles(xf, angles(token_rows(ids, layout), axis, col, inv), ROT, style,
                              backward)
    y = np.empty_like(x)
    ref.poison(y, dtype)
    fn = fusedrope.backward if backward else fusedrope.forward
    fn(cache, x, out=y, ids=ids, style=style, layout=layout,
       dtype="bfloat16" if dtype == "bfloat16" else None)
    got = ref.to_f64(y, dtype)
    ref.assert_close(got, want, mag, dtype, what=f"{axes} {layout} {style} {dtype}")
    assert np.array_equal(got[..., ROT:], xf[..., ROT:])


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_qk_with_axes(layout):
    """forward_qk (GQA) on an axes cache, against the reference."""
    r = ref.rng(31)
    s, b, d = 5, 2, 32
    if layout == "thd":
        b = 1
    cache = fusedrope.Cache("default", rot_dim=d, max_positions=P, theta=1e6, axes="interleaved",
                            sections=[6, 5, 5])
    axis, col = layout_map("interleaved", d // 2, sections=[6, 5, 5])
    inv = default_inv(d, 1e6)
    ids = r.integers(0, P, size=(3, s) if layout == "thd" else (3, b, s)).astype(np.int64)
    q, qf = ref.make(shape_of(layout, s, b, 4, d), "float32", r)
    k, kf = ref.make(shape_of(layout, s, b, 2, d), "float32", r)
    fusedrope.forward_qk(cache, q, k, ids=ids, layout=layout)   # in place
    ang = angles(token_rows(ids, layout), axis, col, inv)
    for got, src in ((q, qf), (k, kf)):
        want, mag = rotate_angles(src, ang, d, "neox")
        ref.assert_close(got.astype(np.float64), want, mag, "float32", what="qk axes")


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
def test_ids_rows_as_views_of_a_persistent_buffer(layout):
    """ids as a view of a [3, max_tokens] buffer: rows contiguous, the row
    stride max_tokens (ids_axis_stride); same bytes as a dense copy, and the
    reference's values; the buffer past the view is never read (poison)."""
    r = ref.rng(37)
    s, b, h, d = 6, 2, 2, 16
    if layout == "thd":
        b = 1
    cache = fusedrope.Cache("default", rot_dim=d, max_positions=P, axes="sections",
                            sections=[2, 3, 3])
    buf = np.full((3, 64), 10**9, np.int64)    # outside the table: a read would raise
    buf[:, :b * s] = r.integers(0, P, size=(3, b * s))
    view = buf[:, :s] if layout == "thd" else buf[:, :b * s].reshape(3, b, s)
    assert not view.flags.c_contiguous and view.strides[0] == 64 * 8
    x, xf = ref.make(shape_of(layout, s, b, h, d), "float32", r)
    y1, y2 = np.full_like(x, np.nan), np.full_like(x, np.nan)
    fusedrope.forward(cache, x, out=y1, ids=view, layout=layout)
    fusedrope.forward(cache, x, out=y2, ids=np.ascontiguousarray(view), layout=layout)
    assert np.array_equal(y1, y2)
    axis, col = layout_map("sections", d // 2, sections=[2, 3, 3])
    want, mag = rotate_angles(xf, angles(token_rows(view, layout), axis, col,
                                         default_inv(d, 10000.0)), d, "neox")
    ref.assert_close(y1.astype(np.float64), want, mag, "float32", what="row stride view")


def test_one_position_per_token_is_1d_rope_bit_for_bit():
    """Every axis at the same position -- 1-row ids, or a broadcast view
    (row stride 0, as position_ids.expand(3, ...)) -- is 1D rope, bit for
    bit (fusedrope.h)."""
    r = ref.rng(41)
    s, b, h, d = 5, 3, 2, 16
    plain = fusedrope.Cache("default", rot_dim=d, max_positions=P)
    mm = fusedrope.Cache("default", rot_dim=d, max_positions=P, axes="interleaved",
                         sections=[4, 2, 2])
    x, _ = ref.make((b, s, h, d), "float32", r)
    ids = r.integers(0, P, size=(b, s)).astype(np.int64)
    want = fusedrope.forward(plain, x, out=np.empty_like(x), ids=ids, layout="bshd")
    for pos in (ids, ids[None], np.broadcast_to(ids, (3, b, s))):
        got = fusedrope.forward(mm, x, out=np.empty_like(x), ids=pos, layout="bshd")
        assert np.array_equal(got, want), pos.shape
    # host ids not compact within a row are copied compact: transformers'
    # text positions arange(s).view(1, 1, -1).expand(3, b, -1) (a batch
    # stride of 0), and a strided view of wider rows
    ar = np.broadcast_to(np.arange(s, dtype=np.int64)[None, None], (3, b, s))
    assert ar.strides[:2] == (0, 0)
    got = fusedrope.forward(mm, x, out=np.empty_like(x), ids=ar, layout="bshd")
    assert np.array_equal(got, fusedrope.forward(plain, x, out=np.empty_like(x), layout="bshd"))
    rows = r.integers(0, P, size=(3, b, s)).astype(np.int64)
    wide = np.zeros((3, b, 2 * s), np.int64)
    wide[:, :, ::2] = rows
    got = fusedrope.forward(mm, x, out=np.empty_like(x), ids=wide[:, :, ::2], layout="bshd")
    assert np.array_equal(got, fusedrope.forward(mm, x, out=np.empty_like(x), ids=rows,
                                                 layout="bshd"))
    # no ids at all: positions 0..s-1 on every axis
    got = fusedrope.forward(mm, x, out=np.empty_like(x), layout="bshd")
    assert np.array_equal(got, fusedrope.forward(plain, x, out=np.empty_like(x), layout="bshd"))


def test_bad_ids_rows_raise_and_write_nothing():
    r = ref.rng(43)
    s, b, h, d = 4, 2, 2, 16
    cache = fusedrope.Cache("default", rot_dim=d, max_positions=P, axes="sections",
                            sections=[2, 3, 3])
    x, _ = ref.make((s, b, h, d), "float32", r)
    y = np.full_like(x, 7.0)
    check = unchanged(x, y)
    good = r.integers(0, P, size=(3, b, s)).astype(np.int64)
    wide = np.zeros((3, b, 2 * s), np.int64)
    cases = [
        (fusedrope.Error, good[:2]),                        # 2 rows for 3 axes (library)
        (ValueError, np.zeros((5, b, s), np.int64)),       # more rows than FUSEDROPE_MAX_AXES
        (ValueError, np.zeros((3, s, b), np.int64)),       # rows of the wrong shape
        (ValueError, good[::-1]),                           # rows in reverse memory order
        (ValueError, np.zeros((3, 1, b, s), np.int64)),    # too many dimensions
        (TypeError, good.astype(np.int32)),
        (fusedrope.Error, np.lib.stride_tricks.as_strided(  # rows overlapping (stride < row)
            good, shape=(3, b, s), strides=(8 * 3, 8 * s, 8))),
        (fusedrope.Error, np.where(good == good, P, 0)),   # a position outside the table
    ]
    for exc, ids in cases:
        with pytest.raises(exc):
            fusedrope.forward(cache, x, out=y, ids=ids)
        with pytest.raises(exc):
            fusedrope.forward(cache, y, ids=ids)           # in place
    with pytest.raises(fusedrope.Error) as e:
        fusedrope.forward(cache, x, out=y, ids=good[:2])
    assert e.value.status_name == "ERR_INVALID" and "ids_axes" in e.value.detail
    # a 1D cache refuses rows (unless broadcast)
    plain = fusedrope.Cache("default", rot_dim=d, max_positions=P)
    with pytest.raises(fusedrope.Error):
        fusedrope.forward(plain, x, out=y, ids=good)
    # thd: [axes, tokens]
    t = np.ones((6, h, d), np.float32)
    check_t = unchanged(t)
    shape_sentence = r"has shape \(3, 5\); \(6\) or \(axes <= 4, 6\) expected"
    for ids, match in ((np.zeros((3, 5), np.int64), shape_sentence),
                       (np.zeros((3, 1, 6), np.int64), "has 3 dimensions")):
        with pytest.raises(ValueError, match=r"ids \(\[tokens\] or \[axes, tokens\]\) " + match):
            fusedrope.forward(cache, t, layout="thd", ids=ids)
    check()
    check_t()


# ----------------------------------------------------------------- caches

def test_bad_axes_arguments():
    with pytest.raises(ValueError, match="axes"):
        fusedrope.Cache("default", rot_dim=16, max_positions=8, axes="mrope")
    with pytest.raises(ValueError, match="custom"):
        fusedrope.Cache("default", rot_dim=16, max_positions=8, pair_axis=[0] * 8)
    with pytest.raises(ValueError, match="entries"):
        fusedrope.Cache("default", rot_dim=16, max_positions=8, axes="custom", pair_axis=[0] * 7)
    with pytest.raises(ValueError, match="255"):
        fusedrope.Cache("default", rot_dim=16, max_positions=8, axes="custom",
                        pair_axis=[256] + [0] * 7)
    with pytest.raises(ValueError, match="at most"):
        fusedrope.Cache("default", rot_dim=16, max_positions=8, axes="sections",
                        sections=[2, 2, 2, 1, 1])
    for kw in (dict(axes="sections", sections=[2, 2, 2]),          # 6 of 8 pairs
               dict(axes="alternating", sections=[2, 4, 2]),       # sections[1] != [2]
               dict(axes="custom", pair_axis=[4] + [0] * 7),       # axis >= MAX_AXES
               dict(axes="custom", pair_axis=[0] * 8, pair_col=[8] + [0] * 7),
               dict(axes="vision_2d", freq_dim=1)):
        with pytest.raises(fusedrope.Error) as e:
            fusedrope.Cache("default", rot_dim=16, max_positions=8, **kw)
        assert e.value.status_name == "ERR_INVALID", kw


def table_ok(cache, inv, a=1.0):
    cos, sin = cache.table()
    rc, rs = ref.table(np.arange(cache.max_positions), inv, a)
    for got, want in ((cos, rc), (sin, rs)):
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= ref.ulp(want, "float32")).all(), f"max err {err.max()}"


@pytest.mark.parametrize("prf,factor", [(0.25, 1.0), (0.5, 8.0), (1.0, 2.0), (0.3, 1.0)])
def test_proportional_table(prf, factor):
    """Gemma 4: inv_i = theta^(-2i/rot_dim) / factor for the first
    floor(prf rot_dim/2) pairs, 0 (angle 0: cos 1, sin 0) past them."""
    rot, theta = 64, 1e6
    cache = fusedrope.Cache("proportional", rot_dim=rot, max_positions=300, theta=theta,
                            partial_rotary_factor=prf, factor=factor)
    rotated = math.floor(prf * rot / 2)
    inv = np.where(np.arange(rot // 2) < rotated, default_inv(rot, theta) / factor, 0.0)
    table_ok(cache, inv)
    cos, sin = cache.table()
    assert (cos[:, rotated:] == 1).all() and (sin[:, rotated:] == 0).all()
    with pytest.raises(fusedrope.Error):
        fusedrope.Cache("proportional", rot_dim=rot, max_positions=8, partial_rotary_factor=1.5)


@pytest.mark.parametrize("freq_dim", [None, 32, 100])
def test_freq_dim(freq_dim):
    rot = 32
    cache = fusedrope.Cache("default", rot_dim=rot, max_positions=200, freq_dim=freq_dim)
    table_ok(cache, default_inv(rot, 10000.0, freq_dim))
    # vision_2d defaults to F = rot_dim/2
    v = fusedrope.Cache("default", rot_dim=rot, max_positions=200, axes="vision_2d")
    table_ok(v, default_inv(rot, 10000.0, rot // 2))


@pytest.mark.parametrize("max_positions,seq_len,long", [
    (64, None, False), (64, 512, False), (64, 513, True), (4096, None, True), (4096, 100, False)])
def test_longrope_regime_by_seq_len(max_positions, seq_len, long):
    """LongRoPE takes long_factor iff seq_len (else max_positions) exceeds
    original_max_positions; the attention factor does not depend on it."""
    d, orig = 32, 512
    r = ref.rng(47)
    sf, lf = list(1.0 + r.random(d // 2)), list(1.0 + 20 * r.random(d // 2))
    cache = fusedrope.Cache("longrope", rot_dim=d, max_positions=max_positions,
                            original_max_positions=orig, factor=16.0, seq_len=seq_len,
                            short_factor=sf, long_factor=lf)
    inv = default_inv(d, 10000.0) / np.asarray(lf if long else sf)
    a = math.sqrt(1 + math.log(16.0) / math.log(orig))
    table_ok(cache, inv, a)


def test_num_threads_passes_through():
    """num_threads reaches the library: it is honoured (same bytes as the
    default) or refused with ERR_UNSUPPORTED in a build without it."""
    x, _ = ref.make((6, 2, 3, 16), "float32", ref.rng(53))
    base = fusedrope.Cache("default", rot_dim=16, max_positions=16)
    want = fusedrope.forward(base, x, out=np.empty_like(x))
    try:
        cache = fusedrope.Cache("default", rot_dim=16, max_positions=16, num_threads=1)
    except fusedrope.Error as e:
        assert e.status_name == "ERR_UNSUPPORTED", e
        assert "num_threads" in e.detail
        return
    assert np.array_equal(fusedrope.forward(cache, x, out=np.empty_like(x)), want)


def test_range_status_passes_through():
    cache = fusedrope.Cache("default", rot_dim=8, max_positions=16)
    x = np.ones((4, 2, 1, 8), np.float32)
    y = np.full_like(x, 7.0)
    word = np.zeros(1, np.int32)
    check = unchanged(x, y)
    try:
        fusedrope.forward(cache, x, out=y, range_status=word)
    except fusedrope.Error as e:
        assert e.status_name == "ERR_UNSUPPORTED", e
        check()
    else:
        assert word[0] == 0 and np.isfinite(y).all()
    check = unchanged(x, y)
    for bad, exc in ((np.zeros(1, np.int64), TypeError), (np.zeros(2, np.int32), ValueError),
                     ([0], TypeError)):
        with pytest.raises(exc):
            fusedrope.forward(cache, x, out=y, range_status=bad)
    ro = np.zeros(1, np.int32)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        fusedrope.forward(cache, x, out=y, range_status=ro)
    check()
