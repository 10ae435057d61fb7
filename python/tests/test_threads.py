"""Calls from several Python threads at once, and the free-threaded CPython.

The extension runs every library call without the GIL, and on a
free-threaded CPython (3.13t, 3.14t) it declares that it needs none: threads
that share one Cache and call at the same time must each get the float64
reference's results, and Caches made at the same time distinct ids.  The
seed is printed by assertion messages and can be set with
FUSEDROPE_TEST_SEED.
"""
import os
import subprocess
import sys
import sysconfig
import threading

import numpy as np
import pytest

import fusedrope
import ref

THREADS = 8
ROUNDS = 12
DTYPES = ["float32", "float16", "bfloat16"]


def test_threads_share_a_cache():
    d, s, b, hq, hk = 32, 48, 2, 4, 2
    cache = fusedrope.Cache("default", rot_dim=d, max_positions=s)
    inv, a = ref.inv_freq("default", d, 10000.0, s)
    cos_t, sin_t = ref.table(np.arange(s), inv, a)
    pos = np.broadcast_to(np.arange(s)[:, None], (s, b))   # sbhd, no ids: the token index
    r = ref.rng(41)
    work = []
    for t in range(THREADS):
        dtype = DTYPES[t % 3]
        q, qf = ref.make((s, b, hq, d), dtype, r)
        k, kf = ref.make((s, b, hk, d), dtype, r)
        want = []
        for backward in (False, True):
            for src in (qf, kf):
                want.append(ref.rotate(src, pos, cos_t, sin_t, d, "neox", backward))
        work.append((dtype, q, k, want))

    start = threading.Barrier(THREADS)
    errors, ids = [], [[] for _ in range(THREADS)]

    def run(t):
        dtype, q, k, want = work[t]
        kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
        try:
            start.wait()
            for i in range(ROUNDS):
                fn = fusedrope.backward_qk if i % 2 else fusedrope.forward_qk
                qo, ko = np.empty_like(q), np.empty_like(k)
                ref.poison(qo, dtype)
                ref.poison(ko, dtype)
                fn(cache, q, k, out=(qo, ko), **kw)
                for got, (y, mag) in zip((qo, ko), want[2 * (i % 2):]):
                    ref.assert_close(ref.to_f64(got, dtype), y, mag, dtype,
                                     what=f"thread {t} round {i} {fn.__name__} {dtype}")
                ids[t].append(fusedrope.Cache("default", rot_dim=8, max_positions=4).id)
        except BaseException as e:   # noqa: B036 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    every = [i for per in ids for i in per]
    assert len(every) == THREADS * ROUNDS and len(set(every)) == len(every), \
        "caches made at the same time share an id"


@pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                    reason="a CPython with the GIL")
def test_free_threaded_import_keeps_the_gil_off():
    """Importing the package must not turn the GIL back on (CPython does for
    an extension that does not declare Py_MOD_GIL_NOT_USED, with a
    RuntimeWarning).  In a fresh interpreter: this one may have imported
    modules that did."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = "import sys, fusedrope; print(sys._is_gil_enabled())"
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and r.stdout == "False\n", r.stdout + r.stderr
