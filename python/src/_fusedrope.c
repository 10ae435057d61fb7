/*
 * _fusedrope: the CPython extension behind the fusedrope package.
 *
 * A thin layer over the installed fusedrope.h: it builds the library's own
 * structs (so none is mirrored by hand in Python), reads arrays from DLPack
 * capsules and turns library failures into fusedrope.Error.  Argument
 * parsing that is easier in Python (names, defaults, Hugging Face configs,
 * choosing the stream) lives in fusedrope/__init__.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <fusedrope.h>

/* ------------------------------------------------------------------ DLPack
 * The structs of the DLPack specification (https://dmlc.github.io/dlpack),
 * written from the spec: ABI version 0.x tensors (capsule "dltensor") and
 * 1.x versioned tensors (capsule "dltensor_versioned").  Only the members
 * this module reads are used, but the layouts are the spec's in full. */
enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4 };
#define DL_FLAG_READ_ONLY 1u
#define DL_FLAG_IS_COPIED 2u

typedef struct {
    int32_t device_type;
    int32_t device_id;
} fr_dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} fr_dl_dtype;

typedef struct {
    void *data;
    fr_dl_device device;
    int32_t ndim;
    fr_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: compact row-major */
    uint64_t byte_offset;
} fr_dl_tensor;

/* Whether t has no elements (an extent 0). */
static int fr_no_elements(const fr_dl_tensor *t)
{
    for (int32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 1;
    return 0;
}

typedef struct fr_dl_managed {
    fr_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct fr_dl_managed *self);
} fr_dl_managed;

typedef struct {
    uint32_t major, minor;
} fr_dl_version;

typedef struct fr_dl_managed_versioned {
    fr_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct fr_dl_managed_versioned *self);
    uint64_t flags;
    fr_dl_tensor dl_tensor;
} fr_dl_managed_versioned;

/* What an export allows besides reading (fr_capsule_tensor's *access). */
enum { FR_WRITABLE = 0, FR_READ_ONLY = 1, FR_A_COPY = 2 };

/* The capsule stays owned by its producer's destructor (we never rename it
 * "used_dltensor"), so the producer frees the tensor when the capsule dies;
 * the caller keeps the capsule alive for the duration of the call.  *access:
 * FR_READ_ONLY, FR_A_COPY (the producer exported a copy of its memory: DLPack
 * allows one when the consumer does not forbid it, and what is written there
 * never reaches the caller's array) or FR_WRITABLE. */
static int fr_capsule_tensor(PyObject *cap, const char *what, fr_dl_tensor **t, int *access)
{
    /* (capsule, True): a read-only array exported through a writable alias
     * of its memory, where the producer's DLPack cannot mark it read-only
     * (NumPy < 2.1: _capsule in fusedrope/__init__.py) */
    int marked = 0;
    if (PyTuple_Check(cap) && PyTuple_GET_SIZE(cap) == 2) {
        marked = PyObject_IsTrue(PyTuple_GET_ITEM(cap, 1)) == 1;
        cap = PyTuple_GET_ITEM(cap, 0);
    }
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        fr_dl_managed_versioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != 1) {
            PyErr_Format(PyExc_BufferError, "%s: DLPack version %u.%u is not supported (1.x is)", what,
                         (unsigned)m->version.major, (unsigned)m->version.minor);
            return -1;
        }
        *t = &m->dl_tensor;
        *access = marked || (m->flags & DL_FLAG_READ_ONLY)  ? FR_READ_ONLY
                  : (m->flags & DL_FLAG_IS_COPIED) ? FR_A_COPY
                                                   : FR_WRITABLE;
        return 0;
    }
    if (PyCapsule_IsValid(cap, "dltensor")) {
        fr_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        *t = &m->dl_tensor;
        *access = marked ? FR_READ_ONLY : FR_WRITABLE;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: not an unused DLPack capsule", what);
    return -1;
}

/* Raises the ValueError for an output that fr_capsule_tensor found not
 * writable; note ends the read-only sentence. */
static void fr_not_writable(const char *what, int access, const char *note)
{
    if (access == FR_A_COPY)
        PyErr_Format(PyExc_ValueError, "%s was exported as a copy of its memory (DLPack flag "
                     "IS_COPIED): the results would be written to the copy and lost; an output "
                     "must share its memory", what);
    else
        PyErr_Format(PyExc_ValueError, "%s is read-only; an output must be writable%s", what, note);
}

/* ------------------------------------------------------------------- errors */

static PyObject *fr_error; /* fusedrope.Error, set by the package at import */

static const char *fr_status_names[] = {"OK", "ERR_INVALID", "ERR_RANGE", "ERR_NOMEM",
                                        "ERR_UNSUPPORTED", "ERR_CUDA"};

/* Sets obj.name = value and drops the reference to value (NULL: fails). */
static int fr_setattr(PyObject *obj, const char *name, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyObject_SetAttrString(obj, name, value);
    Py_DECREF(value);
    return r;
}

/* Raises fusedrope.Error(message) with .status (int), .status_name and
 * .detail (fusedrope_last_error(), read right after the failing call in the
 * same thread). */
static PyObject *fr_raise(fusedrope_status st, const char *detail)
{
    const char *name = (unsigned)st < 6 ? fr_status_names[st] : "UNKNOWN";
    PyObject *exc_type = fr_error ? fr_error : PyExc_RuntimeError;
    PyObject *exc =
        PyObject_CallFunction(exc_type, "s", detail && *detail ? detail : fusedrope_status_string(st));
    if (!exc)
        return NULL;
    if (fr_setattr(exc, "status", PyLong_FromLong((long)st)) < 0 ||
        fr_setattr(exc, "status_name", PyUnicode_FromString(name)) < 0 ||
        fr_setattr(exc, "detail", PyUnicode_FromString(detail ? detail : "")) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject(exc_type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* Registers the package's Error class and returns the one in use: the first
 * registered.  The extension's state lives as long as the process, while the
 * package can run again (importlib.reload, or an import after its modules
 * left sys.modules) and define Error again: it takes the class returned, so
 * every copy of the package raises and catches the same class. */
static PyObject *set_error_class(PyObject *self, PyObject *cls)
{
    (void)self;
    if (!fr_error)
        fr_error = Py_NewRef(cls);
    return Py_NewRef(fr_error);
}

/* -------------------------------------------------------------------- Cache */

typedef struct {
    PyObject_HEAD
    fusedrope_cache *cache;
    int device_id; /* CUDA device the cache lives on (-1 for a CPU cache) */
} CacheObject;

static void Cache_dealloc(CacheObject *self)
{
    fusedrope_cache_destroy(self->cache);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject CacheType;

static PyObject *fr_new_cache(fusedrope_cache *c, int device_id)
{
    CacheObject *o = PyObject_New(CacheObject, &CacheType);
    if (!o) {
        fusedrope_cache_destroy(c);
        return NULL;
    }
    o->cache = c;
    o->device_id = fusedrope_cache_device(c) == FUSEDROPE_DEVICE_CUDA ? device_id : -1;
    return (PyObject *)o;
}

/* A sequence of floats into a new double array of exactly n entries. */
static double *fr_doubles(PyObject *seq, Py_ssize_t n, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, rot_dim/2 = %zd expected", what,
                     PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return NULL;
    }
    double *v = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (v[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(v);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    return v;
}

/* A sequence of ints into a new int array of exactly n entries (or at most n
 * when `at_most`; *count gets the length), each in [lo, hi]. */
static int *fr_ints(PyObject *seq, Py_ssize_t n, int at_most, long lo, long hi, const char *what,
                    Py_ssize_t *count)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (at_most ? len > n : len != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries; %s%zd expected", what, len,
                     at_most ? "at most " : "rot_dim/2 = ", n);
        Py_DECREF(fast);
        return NULL;
    }
    int *v = PyMem_Calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (x == -1 && PyErr_Occurred())
            goto fail;
        if (x < lo || x > hi) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is %ld; it must be in [%ld, %ld]", what, i, x,
                         lo, hi);
            goto fail;
        }
        v[i] = (int)x;
    }
    Py_DECREF(fast);
    if (count)
        *count = len;
    return v;
fail:
    PyMem_Free(v);
    Py_DECREF(fast);
    return NULL;
}

/* A Python int as a C long long: a value past its range is a bad argument
 * (ValueError naming it, as the package's own checks raise), not the
 * conversion's OverflowError. */
static int fr_long_field(PyObject *value, const char *what, long long *dst)
{
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s is %R, outside the range of a 64-bit int",
                         what, value);
        }
        return -1;
    }
    *dst = v;
    return 0;
}

/* An int field of the config from a Python int. */
static int fr_int_field(PyObject *value, const char *what, int *dst)
{
    long long v;
    if (fr_long_field(value, what, &v) < 0)
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is %lld, outside the range of a 32-bit int", what, v);
        return -1;
    }
    *dst = (int)v;
    return 0;
}

/* cache_create(type, rot_dim, max_positions, theta, device, device_id, fields)
 * fields: a dict of the config's other members; those absent keep
 * fusedrope_cache_config_init's defaults for the type.  axes is the
 * fusedrope_axes value, sections up to FUSEDROPE_MAX_AXES ints, pair_axis and
 * pair_col rot_dim/2 ints each (copied by the library at create). */
static PyObject *cache_create(PyObject *self, PyObject *args)
{
    int type, rot_dim, device, device_id;
    long long max_positions;
    double theta;
    PyObject *fields;
    (void)self;
    if (!PyArg_ParseTuple(args, "iiLdiiO!", &type, &rot_dim, &max_positions, &theta, &device,
                          &device_id, &PyDict_Type, &fields))
        return NULL;

    fusedrope_cache_config cfg;
    fusedrope_cache_config_init(&cfg, (fusedrope_rope_type)type, rot_dim, (int64_t)max_positions,
                                theta);
    double *shortf = NULL, *longf = NULL;
    int *pair_axis = NULL, *pair_col = NULL;
    unsigned char *pair_axis8 = NULL;
    const Py_ssize_t half = rot_dim > 0 ? rot_dim / 2 : 0;
    PyObject *key, *value;
    Py_ssize_t it = 0;
    while (PyDict_Next(fields, &it, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key);
        if (!k)
            goto fail;
        if (value == Py_None)
            continue;
        double *dst = NULL;
        int64_t *idst = NULL;
        if (!strcmp(k, "factor")) dst = &cfg.factor;
        else if (!strcmp(k, "attention_factor")) dst = &cfg.attention_factor;
        else if (!strcmp(k, "beta_fast")) dst = &cfg.beta_fast;
        else if (!strcmp(k, "beta_slow")) dst = &cfg.beta_slow;
        else if (!strcmp(k, "mscale")) dst = &cfg.mscale;
        else if (!strcmp(k, "mscale_all_dim")) dst = &cfg.mscale_all_dim;
        else if (!strcmp(k, "low_freq_factor")) dst = &cfg.low_freq_factor;
        else if (!strcmp(k, "high_freq_factor")) dst = &cfg.high_freq_factor;
        else if (!strcmp(k, "original_max_positions")) idst = &cfg.original_max_positions;
        else if (!strcmp(k, "seq_len")) idst = &cfg.seq_len;
        else if (!strcmp(k, "truncate")) {
            int b = PyObject_IsTrue(value);
            if (b < 0)
                goto fail;
            cfg.truncate = b;
            continue;
        } else if (!strcmp(k, "short_factor") || !strcmp(k, "long_factor")) {
            double **slot = k[0] == 's' ? &shortf : &longf;
            *slot = fr_doubles(value, half, k);
            if (!*slot)
                goto fail;
            continue;
        } else if (!strcmp(k, "partial_rotary_factor")) {
            dst = &cfg.partial_rotary_factor;
        } else if (!strcmp(k, "freq_dim") || !strcmp(k, "num_threads") || !strcmp(k, "axes")) {
            int v;
            if (fr_int_field(value, k, &v) < 0)
                goto fail;
            if (k[0] == 'f')
                cfg.freq_dim = v;
            else if (k[0] == 'n')
                cfg.num_threads = v;
            else
                cfg.axes = (fusedrope_axes)v;
            continue;
        } else if (!strcmp(k, "sections")) {
            Py_ssize_t cnt;
            int *sec = fr_ints(value, FUSEDROPE_MAX_AXES, 1, INT32_MIN, INT32_MAX, k, &cnt);
            if (!sec)
                goto fail;
            for (int i = 0; i < FUSEDROPE_MAX_AXES; i++)
                cfg.sections[i] = i < cnt ? sec[i] : 0;
            PyMem_Free(sec);
            continue;
        } else if (!strcmp(k, "pair_axis")) {
            /* unsigned char in the config: values past 255 would wrap */
            pair_axis = fr_ints(value, half, 0, 0, 255, k, NULL);
            if (!pair_axis)
                goto fail;
            continue;
        } else if (!strcmp(k, "pair_col")) {
            pair_col = fr_ints(value, half, 0, INT32_MIN, INT32_MAX, k, NULL);
            if (!pair_col)
                goto fail;
            continue;
        } else {
            PyErr_Format(PyExc_TypeError, "unknown cache field '%s'", k);
            goto fail;
        }
        if (dst) {
            *dst = PyFloat_AsDouble(value);
            if (*dst == -1.0 && PyErr_Occurred())
                goto fail;
        } else {
            long long v;
            if (fr_long_field(value, k, &v) < 0)
                goto fail;
            *idst = (int64_t)v;
        }
    }
    cfg.short_factor = shortf;
    cfg.long_factor = longf;
    if (pair_axis) {
        pair_axis8 = PyMem_Malloc((size_t)(half ? half : 1));
        if (!pair_axis8) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t j = 0; j < half; j++)
            pair_axis8[j] = (unsigned char)pair_axis[j];
        cfg.pair_axis = pair_axis8;
    }
    cfg.pair_col = pair_col;

    fusedrope_cache *c = NULL;
    fusedrope_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fusedrope_cache_create(&cfg, (fusedrope_device)device, &c);
    Py_END_ALLOW_THREADS
    /* all copied by the library at create */
    PyMem_Free(shortf);
    PyMem_Free(longf);
    PyMem_Free(pair_axis);
    PyMem_Free(pair_axis8);
    PyMem_Free(pair_col);
    if (st != FUSEDROPE_OK)
        return fr_raise(st, fusedrope_last_error());
    return fr_new_cache(c, device_id);
fail:
    PyMem_Free(shortf);
    PyMem_Free(longf);
    PyMem_Free(pair_axis);
    PyMem_Free(pair_axis8);
    PyMem_Free(pair_col);
    return NULL;
}

/* cache_from_table(cos, sin, positions, rot_dim, device, device_id):
 * cos and sin are C-contiguous float32 buffers of positions*rot_dim/2. */
static PyObject *cache_from_table(PyObject *self, PyObject *args)
{
    Py_buffer cb, sb;
    long long positions;
    int rot_dim, device, device_id;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*Liii", &cb, &sb, &positions, &rot_dim, &device, &device_id))
        return NULL;
    PyObject *res = NULL;
    long long half = rot_dim > 0 ? rot_dim / 2 : 0;
    if (positions > 0 && half > 0 && positions > (long long)(PY_SSIZE_T_MAX / 4) / half) {
        PyErr_Format(PyExc_ValueError,
                     "cos and sin of positions*rot_dim/2 = %lld*%lld float32 each exceed the "
                     "address space", positions, half);
        goto out;
    }
    Py_ssize_t need = (Py_ssize_t)(positions > 0 && half > 0 ? positions * half : 0);
    if (cb.len != need * 4 || sb.len != need * 4) {
        PyErr_Format(PyExc_ValueError, "cos and sin must hold positions*rot_dim/2 = %zd float32 each",
                     need);
        goto out;
    }
    fusedrope_cache *c = NULL;
    fusedrope_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fusedrope_cache_create_from_table(cb.buf, sb.buf, (int64_t)positions, rot_dim,
                                           (fusedrope_device)device, &c);
    Py_END_ALLOW_THREADS
    if (st != FUSEDROPE_OK)
        fr_raise(st, fusedrope_last_error());
    else
        res = fr_new_cache(c, device_id);
out:
    PyBuffer_Release(&cb);
    PyBuffer_Release(&sb);
    return res;
}

static PyObject *Cache_copy_table(CacheObject *self, PyObject *args)
{
    Py_buffer cb, sb;
    if (!PyArg_ParseTuple(args, "w*w*", &cb, &sb))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t need = (Py_ssize_t)(fusedrope_cache_max_positions(self->cache) *
                                   (fusedrope_cache_rot_dim(self->cache) / 2));
    if (cb.len != need * 4 || sb.len != need * 4) {
        PyErr_Format(PyExc_ValueError, "copy_table needs two buffers of %zd float32", need);
        goto out;
    }
    fusedrope_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fusedrope_cache_copy_table(self->cache, cb.buf, sb.buf);
    Py_END_ALLOW_THREADS
    if (st != FUSEDROPE_OK)
        fr_raise(st, fusedrope_last_error());
    else
        res = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&cb);
    PyBuffer_Release(&sb);
    return res;
}

static PyObject *Cache_check(CacheObject *self, PyObject *args)
{
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "K", &stream))
        return NULL;
    fusedrope_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fusedrope_cache_check(self->cache, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    if (st != FUSEDROPE_OK)
        return fr_raise(st, fusedrope_last_error());
    Py_RETURN_NONE;
}

static PyObject *Cache_get_rot_dim(CacheObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(fusedrope_cache_rot_dim(self->cache));
}
static PyObject *Cache_get_max_positions(CacheObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(fusedrope_cache_max_positions(self->cache));
}
static PyObject *Cache_get_device(CacheObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong((long)fusedrope_cache_device(self->cache));
}
static PyObject *Cache_get_device_id(CacheObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(self->device_id);
}

static PyMethodDef Cache_methods[] = {
    {"copy_table", (PyCFunction)Cache_copy_table, METH_VARARGS, "copy_table(cos, sin): fill two writable float32 buffers"},
    {"check", (PyCFunction)Cache_check, METH_VARARGS, "check(stream): fusedrope_cache_check"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Cache_getset[] = {
    {"rot_dim", (getter)Cache_get_rot_dim, NULL, NULL, NULL},
    {"max_positions", (getter)Cache_get_max_positions, NULL, NULL, NULL},
    {"device", (getter)Cache_get_device, NULL, "fusedrope_device value", NULL},
    {"device_id", (getter)Cache_get_device_id, NULL, "CUDA device index, -1 on the CPU", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fusedrope._fusedrope.CacheHandle",
    .tp_basicsize = sizeof(CacheObject),
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An owned fusedrope_cache (released with the object).",
    .tp_methods = Cache_methods,
    .tp_getset = Cache_getset,
};

/* -------------------------------------------------------------------- apply */

enum { LAYOUT_SBHD = 0, LAYOUT_BSHD = 1, LAYOUT_THD = 2 };
static const char *fr_layout_names[] = {"sbhd", "bshd", "thd"};

static const char *fr_dev_name(int32_t t)
{
    switch (t) {
    case DL_CPU: return "cpu";
    case DL_CUDA: return "cuda";
    case DL_CUDA_HOST: return "cuda_host";
    case DL_CUDA_MANAGED: return "cuda_managed";
    default: return "unsupported";
    }
}

/* Whether memory of DLPack device `t` (index `id`) may be passed to the
 * cache: host memory to a CPU cache, device memory of its own device to a
 * CUDA cache, managed memory to either.  The library cannot see this on a
 * CPU cache (README: device pointers go unnoticed there), so it is checked
 * here for every array. */
static int fr_device_ok(const CacheObject *c, const fr_dl_device *d, const char *what)
{
    int cuda_cache = c->device_id >= 0;
    int ok;
    if (d->device_type == DL_CUDA_MANAGED)
        ok = !cuda_cache || d->device_id == c->device_id;
    else if (cuda_cache)
        ok = d->device_type == DL_CUDA && d->device_id == c->device_id;
    else
        ok = d->device_type == DL_CPU || d->device_type == DL_CUDA_HOST;
    if (!ok) {
        if (cuda_cache)
            PyErr_Format(PyExc_ValueError, "%s is on %s:%d but the cache is on cuda:%d", what,
                         fr_dev_name(d->device_type), (int)d->device_id, c->device_id);
        else
            PyErr_Format(PyExc_ValueError, "%s is on %s:%d but the cache is on the CPU", what,
                         fr_dev_name(d->device_type), (int)d->device_id);
    }
    return ok;
}

/* A DLPack tensor into a fusedrope_tensor of the given layout.  `bf16` says
 * that 16-bit integer arrays hold bfloat16 (dtype="bfloat16", for NumPy,
 * which has no bfloat16 of its own). */
static int fr_tensor(const CacheObject *c, PyObject *cap, int layout, int bf16, int is_output,
                     const char *what, fusedrope_tensor *out, int32_t *device_type)
{
    fr_dl_tensor *t;
    int access;
    if (fr_capsule_tensor(cap, what, &t, &access) < 0)
        return -1;
    if (!fr_device_ok(c, &t->device, what))
        return -1;
    *device_type = t->device.device_type;
    if (is_output && access != FR_WRITABLE) {
        fr_not_writable(what, access, " (a call without out= writes its input in place)");
        return -1;
    }
    int want = layout == LAYOUT_THD ? 3 : 4;
    if (t->ndim != want) {
        PyErr_Format(PyExc_ValueError, "%s has %d dimensions; layout '%s' needs %d", what,
                     (int)t->ndim, fr_layout_names[layout], want);
        return -1;
    }
    fusedrope_dtype dt;
    const fr_dl_dtype *d = &t->dtype;
    if (d->lanes != 1)
        goto bad_dtype;
    if (d->code == DL_FLOAT && d->bits == 32 && !bf16)
        dt = FUSEDROPE_FLOAT32;
    else if (d->code == DL_FLOAT && d->bits == 16 && !bf16)
        dt = FUSEDROPE_FLOAT16;
    else if (d->code == DL_BFLOAT && d->bits == 16)
        dt = FUSEDROPE_BFLOAT16;
    else if ((d->code == DL_UINT || d->code == DL_INT) && d->bits == 16 && bf16)
        dt = FUSEDROPE_BFLOAT16;
    else
        goto bad_dtype;

    int64_t shape[4], strides[4];
    int empty = 0;
    for (int i = 0; i < want; i++) {
        shape[i] = t->shape[i];
        empty |= shape[i] == 0;
    }
    /* An array without elements has no meaningful strides (NumPy exports
     * zeros): compact ones stand in, as for one without strides. */
    if (t->strides && !empty) {
        for (int i = 0; i < want; i++)
            strides[i] = t->strides[i];
    } else {
        int64_t s = 1;
        for (int i = want - 1; i >= 0; i--) {
            strides[i] = s;
            s *= shape[i];
        }
    }
    /* A dimension of extent 1 has no meaningful stride: frameworks report
     * anything there, and the library never multiplies by it. */
    if (shape[want - 1] > 1 && strides[want - 1] != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: channels (the last dimension) must be contiguous, but its stride is %lld "
                     "elements; make the array contiguous in its last dimension first",
                     what, (long long)strides[want - 1]);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->data = t->data ? (char *)t->data + t->byte_offset : NULL;
    out->dtype = dt;
    if (layout == LAYOUT_THD) {
        out->seq_len = shape[0];
        out->batch = 1;
        out->heads = shape[1];
        out->head_dim = shape[2];
        out->stride_seq = shape[0] > 1 ? strides[0] : 0;
        out->stride_batch = 0;
        out->stride_head = shape[1] > 1 ? strides[1] : 0;
    } else {
        int si = layout == LAYOUT_SBHD ? 0 : 1, bi = 1 - si;
        out->seq_len = shape[si];
        out->batch = shape[bi];
        out->heads = shape[2];
        out->head_dim = shape[3];
        out->stride_seq = shape[si] > 1 ? strides[si] : 0;
        out->stride_batch = shape[bi] > 1 ? strides[bi] : 0;
        out->stride_head = shape[2] > 1 ? strides[2] : 0;
    }
    return 0;
bad_dtype:
    if (bf16) /* the call is bfloat16: dtype='bfloat16', or another array is */
        PyErr_Format(PyExc_TypeError,
                     "%s has DLPack dtype (code %d, %d bits, %d lanes), but the call's arrays "
                     "are bfloat16 (dtype='bfloat16', or another of its arrays is bfloat16): "
                     "every tensor of a call must have the same dtype",
                     what, (int)d->code, (int)d->bits, (int)d->lanes);
    else
        PyErr_Format(PyExc_TypeError,
                     "%s has DLPack dtype (code %d, %d bits, %d lanes); float32, float16 or "
                     "bfloat16 is needed (16-bit integers only with dtype='bfloat16')",
                     what, (int)d->code, (int)d->bits, (int)d->lanes);
    return -1;
}

/* A plain array (offsets, cu_seqlens, range_status; the norm's rstd and
 * weight gradients): contiguous, of the given DLPack type and exact shape,
 * on the cache's device; writable where the library writes it. */
static int fr_plain_array(const CacheObject *c, PyObject *cap, const char *what, int code,
                          int bits, int writable, int ndim, const int64_t *shape, const void **data)
{
    fr_dl_tensor *t;
    int access;
    if (fr_capsule_tensor(cap, what, &t, &access) < 0)
        return -1;
    if (!fr_device_ok(c, &t->device, what))
        return -1;
    if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be %s%d (got DLPack code %d, %d bits)", what,
                     code == DL_FLOAT ? "float" : "int", bits, (int)t->dtype.code,
                     (int)t->dtype.bits);
        return -1;
    }
    if (writable && access != FR_WRITABLE) {
        fr_not_writable(what, access, "");
        return -1;
    }
    int shape_ok = t->ndim == ndim;
    for (int i = 0; shape_ok && i < ndim; i++)
        shape_ok = t->shape[i] == shape[i];
    if (!shape_ok) {
        char got[96] = "", want[96] = "";
        for (int i = 0; i < t->ndim && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)shape[i]);
        PyErr_Format(PyExc_ValueError, "%s has shape (%s); (%s) expected", what, got, want);
        return -1;
    }
    if (t->strides && !fr_no_elements(t)) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            if (shape[i] > 1 && t->strides[i] != s) {
                PyErr_Format(PyExc_ValueError, "%s must be contiguous", what);
                return -1;
            }
            s *= shape[i];
        }
    }
    *data = t->data ? (const char *)t->data + t->byte_offset : NULL;
    return 0;
}

/*
 * ids: one position per token ([batch, seq], THD: [tokens]), or one row per
 * position axis ([axes, batch, seq], THD: [axes, tokens]).  Within a row the
 * positions must be contiguous; the rows may lie any distance apart (a view
 * of a persistent [axes, max_tokens] buffer): the array's row stride becomes
 * pos->ids_axis_stride.  A row stride of 0 (a broadcast view, as
 * position_ids.expand(3, ...)) means every axis at the same position: one
 * row.  The library checks the row count against the cache's axes.
 */
static int fr_ids(const CacheObject *c, PyObject *cap, int layout, const fusedrope_tensor *t0,
                  fusedrope_positions *pos)
{
    const int base = layout == LAYOUT_THD ? 1 : 2; /* dimensions of one row */
    const char *what = layout == LAYOUT_THD ? "ids ([tokens] or [axes, tokens])"
                                            : "ids ([batch, seq] or [axes, batch, seq])";
    const int64_t want[2] = {layout == LAYOUT_THD ? t0->seq_len : t0->batch, t0->seq_len};
    fr_dl_tensor *t;
    int access;
    if (fr_capsule_tensor(cap, "ids", &t, &access) < 0)
        return -1;
    if (!fr_device_ok(c, &t->device, "ids"))
        return -1;
    if (t->dtype.code != DL_INT || t->dtype.bits != 64 || t->dtype.lanes != 1) {
        PyErr_Format(PyExc_TypeError, "ids must be int64 (got DLPack code %d, %d bits)",
                     (int)t->dtype.code, (int)t->dtype.bits);
        return -1;
    }
    if (t->ndim != base && t->ndim != base + 1) {
        PyErr_Format(PyExc_ValueError, "%s has %d dimensions", what, (int)t->ndim);
        return -1;
    }
    const int r = t->ndim - base; /* 1 when ids has a row per axis */
    int shape_ok = 1;
    for (int i = 0; i < base; i++)
        shape_ok &= t->shape[r + i] == want[i];
    if (!shape_ok || (r && (t->shape[0] < 1 || t->shape[0] > FUSEDROPE_MAX_AXES))) {
        char got[96] = "";
        for (int i = 0; i < t->ndim && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        if (layout == LAYOUT_THD)
            PyErr_Format(PyExc_ValueError, "%s has shape (%s); (%lld) or (axes <= %d, %lld) "
                         "expected", what, got, (long long)want[0], FUSEDROPE_MAX_AXES,
                         (long long)want[0]);
        else
            PyErr_Format(PyExc_ValueError, "%s has shape (%s); (%lld, %lld) or (axes <= %d, "
                         "%lld, %lld) expected", what, got, (long long)want[0],
                         (long long)want[1], FUSEDROPE_MAX_AXES, (long long)want[0],
                         (long long)want[1]);
        return -1;
    }
    /* within a row: compact row-major (strides NULL means all of it is, and
     * an array without elements has no meaningful strides) */
    if (t->strides && !fr_no_elements(t)) {
        int64_t step = 1;
        for (int i = base - 1; i >= 0; i--) {
            if (want[i] > 1 && t->strides[r + i] != step) {
                PyErr_Format(PyExc_ValueError,
                             "%s must be contiguous within a row (a row's strides must be "
                             "compact; rows may be apart): pass a compact copy "
                             "(ids.contiguous())", what);
                return -1;
            }
            step *= want[i];
        }
    }
    if (r && t->shape[0] > 1) {
        const int64_t rs = t->strides ? t->strides[0] : want[0] * (base > 1 ? want[1] : 1);
        if (rs < 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: rows in reverse memory order (row stride %lld) are not supported",
                         what, (long long)rs);
            return -1;
        }
        /* rs == 0: a broadcast view, every axis at the same position: one row.
         * Otherwise the library checks rs against the row length. */
        if (rs > 0) {
            pos->ids_axes = (int)t->shape[0];
            pos->ids_axis_stride = rs;
        }
    }
    pos->ids = t->data ? (const int64_t *)((const char *)t->data + t->byte_offset) : NULL;
    return 0;
}

/* The call's positions from its Python arguments (capsules or None); t0
 * is the call's first tensor (its batch and sequence shape the arrays). */
static int fr_call_positions(const CacheObject *c, int layout, const fusedrope_tensor *t0,
                             PyObject *ids, PyObject *offsets, PyObject *cu, int cp_size,
                             int cp_rank, PyObject *range_status, fusedrope_positions *pos)
{
    int64_t shape[2];
    fusedrope_positions_init(pos);
    pos->cp_size = cp_size;
    pos->cp_rank = cp_rank;
    if (cu != Py_None) {
        fr_dl_tensor *ct;
        int ro;
        if (layout != LAYOUT_THD) {
            PyErr_SetString(PyExc_ValueError, "cu_seqlens needs layout='thd'");
            return -1;
        }
        if (fr_capsule_tensor(cu, "cu_seqlens", &ct, &ro) < 0)
            return -1;
        if (ct->ndim != 1 || ct->shape[0] < 2) {
            PyErr_SetString(PyExc_ValueError,
                            "cu_seqlens must be 1-D with num_seqs+1 >= 2 entries");
            return -1;
        }
        shape[0] = ct->shape[0];
        if (fr_plain_array(c, cu, "cu_seqlens", DL_INT, 32, 0, 1, shape,
                           (const void **)&pos->cu_seqlens) < 0)
            return -1;
        pos->num_seqs = shape[0] - 1;
    }
    if (ids != Py_None && fr_ids(c, ids, layout, t0, pos) < 0)
        return -1;
    if (range_status != Py_None) {
        fr_dl_tensor *rt;
        int ro;
        const void *word;
        if (fr_capsule_tensor(range_status, "range_status", &rt, &ro) < 0)
            return -1;
        shape[0] = 1;
        if (fr_plain_array(c, range_status, "range_status (one int32)", DL_INT, 32, 1,
                           rt->ndim ? 1 : 0, shape, &word) < 0)
            return -1;
        pos->range_status = (int32_t *)(uintptr_t)word; /* checked writable above */
    }
    if (offsets != Py_None) {
        shape[0] = pos->cu_seqlens ? pos->num_seqs : t0->batch;
        if (fr_plain_array(c, offsets,
                           pos->cu_seqlens ? "offsets (one per sequence)"
                                           : "offsets (one per batch entry)",
                           DL_INT, 64, 0, 1, shape, (const void **)&pos->offsets) < 0)
            return -1;
    }
    return 0;
}

/*
 * apply(cache, op, style, layout, bf16, tensors, ids, offsets, cu_seqlens,
 *       cp_size, cp_rank, stream, range_status)
 * op: 0 forward, 1 backward (tensors: [in, out]), 2 forward_qk, 3
 * backward_qk (tensors: [q_in, q_out, k_in, k_out]).  The same capsule may
 * appear as an input and its output (in place).  ids, offsets, cu_seqlens:
 * capsules or None.  stream: a cudaStream_t as an integer (0: default).
 */
static PyObject *apply(PyObject *self, PyObject *args)
{
    PyObject *cacheobj, *tensors, *ids, *offsets, *cu, *range_status = Py_None;
    int op, style, layout, bf16, cp_size, cp_rank;
    unsigned long long stream;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!iiipO!OOOiiK|O", &CacheType, &cacheobj, &op, &style, &layout,
                          &bf16, &PyList_Type, &tensors, &ids, &offsets, &cu, &cp_size, &cp_rank,
                          &stream, &range_status))
        return NULL;
    CacheObject *c = (CacheObject *)cacheobj;
    static const char *names[2][4] = {{"x", "out", "", ""}, {"q", "q_out", "k", "k_out"}};
    static const char *bnames[2][4] = {{"dy", "out", "", ""}, {"dq_out", "out[0]", "dk_out", "out[1]"}};
    int qk = op >= 2, n = qk ? 4 : 2;
    if (op < 0 || op > 3 || layout < 0 || layout > 2) {
        PyErr_SetString(PyExc_ValueError, "bad op or layout");
        return NULL;
    }
    if (PyList_GET_SIZE(tensors) != n) {
        PyErr_Format(PyExc_ValueError, "apply: %d tensors expected", n);
        return NULL;
    }
    fusedrope_tensor t[4];
    int32_t devtype[4];
    for (int i = 0; i < n; i++) {
        const char *what = (op & 1) ? bnames[qk][i] : names[qk][i];
        if (fr_tensor(c, PyList_GET_ITEM(tensors, i), layout, bf16, i & 1, what, &t[i],
                      &devtype[i]) < 0)
            return NULL;
    }

    fusedrope_positions pos;
    if (fr_call_positions(c, layout, &t[0], ids, offsets, cu, cp_size, cp_rank, range_status,
                          &pos) < 0)
        return NULL;

    fusedrope_status st;
    const fusedrope_cache *cache = c->cache;
    void *s = (void *)(uintptr_t)stream;
    Py_BEGIN_ALLOW_THREADS
    switch (op) {
    case 0: st = fusedrope_forward(cache, (fusedrope_style)style, &pos, &t[0], &t[1], s); break;
    case 1: st = fusedrope_backward(cache, (fusedrope_style)style, &pos, &t[0], &t[1], s); break;
    case 2:
        st = fusedrope_forward_qk(cache, (fusedrope_style)style, &pos, &t[0], &t[1], &t[2], &t[3], s);
        break;
    default:
        st = fusedrope_backward_qk(cache, (fusedrope_style)style, &pos, &t[0], &t[1], &t[2], &t[3], s);
        break;
    }
    Py_END_ALLOW_THREADS
    if (st != FUSEDROPE_OK)
        return fr_raise(st, fusedrope_last_error());
    Py_RETURN_NONE;
}

/* A norm weight: [head_dim], contiguous, float32 or a 16-bit float type
 * (bf16: 16-bit integers hold bfloat16), on the cache's device. */
static int fr_norm_weight(const CacheObject *c, PyObject *cap, const char *what, int bf16,
                          int64_t head_dim, const void **data, fusedrope_dtype *dt)
{
    fr_dl_tensor *t;
    int access;
    if (fr_capsule_tensor(cap, what, &t, &access) < 0)
        return -1;
    const fr_dl_dtype *d = &t->dtype;
    int code = d->code, bits = d->bits;
    /* bf16 marks 16-bit integer arrays as bfloat16; real float arrays keep
     * their own type (float32 weights go with any tensors) */
    if (d->lanes == 1 && code == DL_FLOAT && bits == 32)
        *dt = FUSEDROPE_FLOAT32;
    else if (d->lanes == 1 && code == DL_FLOAT && bits == 16)
        *dt = FUSEDROPE_FLOAT16;
    else if (d->lanes == 1 && bits == 16 &&
             (code == DL_BFLOAT || (bf16 && (code == DL_UINT || code == DL_INT))))
        *dt = FUSEDROPE_BFLOAT16;
    else {
        PyErr_Format(PyExc_TypeError,
                     "%s has DLPack dtype (code %d, %d bits, %d lanes); float32 or the tensors' "
                     "dtype is needed", what, code, bits, (int)d->lanes);
        return -1;
    }
    return fr_plain_array(c, cap, what, code, bits, 0, 1, &head_dim, data);
}

/*
 * norm(cache, op, style, layout, bf16, tensors, ids, offsets, cu_seqlens,
 *      cp_size, cp_rank, stream, range_status, spec)
 * op 0: fusedrope_norm_forward_qk, tensors [q_in, q_out, k_in, k_out];
 * op 1: fusedrope_norm_backward_qk, tensors [q_saved, dq_out, dq_in,
 * k_saved, dk_out, dk_in]; the k entries None for q only.  spec: (weight
 * kind, rounding, eps, saved_output, q_weight, k_weight, q_rstd, k_rstd,
 * dq_weight, dk_weight), the arrays capsules or None.
 */
static PyObject *norm(PyObject *self, PyObject *args)
{
    PyObject *cacheobj, *tensors, *ids, *offsets, *cu, *range_status, *spec;
    PyObject *caps[6];
    int op, style, layout, bf16, cp_size, cp_rank, kind, rounding, saved_output;
    double eps;
    unsigned long long stream;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!iiipO!OOOiiKOO!", &CacheType, &cacheobj, &op, &style,
                          &layout, &bf16, &PyList_Type, &tensors, &ids, &offsets, &cu, &cp_size,
                          &cp_rank, &stream, &range_status, &PyTuple_Type, &spec))
        return NULL;
    if (!PyArg_ParseTuple(spec, "iidpOOOOOO", &kind, &rounding, &eps, &saved_output, &caps[0],
                          &caps[1], &caps[2], &caps[3], &caps[4], &caps[5]))
        return NULL;
    CacheObject *c = (CacheObject *)cacheobj;
    static const char *names[2][6] = {{"q", "q_out", "k", "k_out", "", ""},
                                      {"q_saved", "dq_out", "dq_in", "k_saved", "dk_out", "dk_in"}};
    const int per = op ? 3 : 2, n = 2 * per;
    if (op < 0 || op > 1 || layout < 0 || layout > 2) {
        PyErr_SetString(PyExc_ValueError, "bad op or layout");
        return NULL;
    }
    if (PyList_GET_SIZE(tensors) != n) {
        PyErr_Format(PyExc_ValueError, "norm: %d tensors expected", n);
        return NULL;
    }
    fusedrope_tensor t[6];
    const fusedrope_tensor *tp[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    int32_t devtype;
    for (int i = 0; i < n; i++) {
        PyObject *cap = PyList_GET_ITEM(tensors, i);
        if (cap == Py_None)
            continue;
        if (fr_tensor(c, cap, layout, bf16, i % per == per - 1, names[op][i], &t[i], &devtype) < 0)
            return NULL;
        tp[i] = &t[i];
    }
    if (!tp[0]) {
        PyErr_SetString(PyExc_ValueError, "norm: q is required");
        return NULL;
    }

    fusedrope_positions pos;
    if (fr_call_positions(c, layout, &t[0], ids, offsets, cu, cp_size, cp_rank, range_status,
                          &pos) < 0)
        return NULL;

    fusedrope_norm nm;
    fusedrope_norm_init(&nm);
    nm.weight = (fusedrope_norm_weight)kind;
    nm.rounding = (fusedrope_norm_rounding)rounding;
    nm.eps = eps;
    nm.saved_output = saved_output;
    {
        const int64_t hd = t[0].head_dim;
        const void *w[2] = {NULL, NULL};
        fusedrope_dtype wdt[2] = {FUSEDROPE_FLOAT32, FUSEDROPE_FLOAT32};
        static const char *wnames[2] = {"q_weight", "k_weight"};
        for (int k = 0; k < 2; k++)
            if (caps[k] != Py_None &&
                fr_norm_weight(c, caps[k], wnames[k], bf16, k ? (tp[per] ? tp[per]->head_dim : hd)
                                                              : hd, &w[k], &wdt[k]) < 0)
                return NULL;
        if (w[0] && w[1] && wdt[0] != wdt[1]) {
            PyErr_SetString(PyExc_TypeError, "q_weight and k_weight must have the same dtype");
            return NULL;
        }
        nm.weight_dtype = w[0] ? wdt[0] : wdt[1];
        nm.q_weight = w[0];
        nm.k_weight = w[1];
    }
    {
        /* rstd: [batch, seq, heads] (thd: [tokens, heads]) float32 */
        static const char *rnames[2] = {"rstd[0] (q's rstd)", "rstd[1] (k's rstd)"};
        float **rdst[2] = {&nm.q_rstd, &nm.k_rstd};
        for (int k = 0; k < 2; k++) {
            const fusedrope_tensor *tk = tp[k * per];
            int64_t shape[3];
            int nd;
            if (caps[2 + k] == Py_None)
                continue;
            if (!tk) {
                PyErr_Format(PyExc_ValueError, "%s given without k", rnames[k]);
                return NULL;
            }
            if (layout == LAYOUT_THD) {
                nd = 2;
                shape[0] = tk->seq_len;
                shape[1] = tk->heads;
            } else {
                nd = 3;
                shape[0] = tk->batch;
                shape[1] = tk->seq_len;
                shape[2] = tk->heads;
            }
            if (fr_plain_array(c, caps[2 + k], rnames[k], DL_FLOAT, 32, op == 0, nd, shape,
                               (const void **)rdst[k]) < 0)
                return NULL;
        }
    }
    {
        static const char *gnames[2] = {"dweight[0] (q_weight's gradient)",
                                        "dweight[1] (k_weight's gradient)"};
        float **gdst[2] = {&nm.dq_weight, &nm.dk_weight};
        for (int k = 0; k < 2; k++) {
            const fusedrope_tensor *tk = tp[k * per];
            int64_t hd;
            if (caps[4 + k] == Py_None)
                continue;
            if (!tk) {
                PyErr_Format(PyExc_ValueError, "%s given without k", gnames[k]);
                return NULL;
            }
            hd = tk->head_dim;
            if (fr_plain_array(c, caps[4 + k], gnames[k], DL_FLOAT, 32, 1, 1, &hd,
                               (const void **)gdst[k]) < 0)
                return NULL;
        }
    }

    fusedrope_status st;
    const fusedrope_cache *cache = c->cache;
    void *s = (void *)(uintptr_t)stream;
    Py_BEGIN_ALLOW_THREADS
    if (op == 0)
        st = fusedrope_norm_forward_qk(cache, (fusedrope_style)style, &pos, &nm, tp[0], tp[1],
                                       tp[2], tp[3], s);
    else
        st = fusedrope_norm_backward_qk(cache, (fusedrope_style)style, &pos, &nm, tp[0], tp[1],
                                        tp[2], tp[3], tp[4], tp[5], s);
    Py_END_ALLOW_THREADS
    if (st != FUSEDROPE_OK)
        return fr_raise(st, fusedrope_last_error());
    Py_RETURN_NONE;
}

static PyObject *version(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(si)", fusedrope_version(), fusedrope_version_number());
}

static PyObject *cuda_available(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyBool_FromLong(fusedrope_cuda_available());
}

static PyMethodDef methods[] = {
    {"cache_create", cache_create, METH_VARARGS, NULL},
    {"cache_from_table", cache_from_table, METH_VARARGS, NULL},
    {"apply", apply, METH_VARARGS, NULL},
    {"norm", norm, METH_VARARGS, NULL},
    {"version", version, METH_NOARGS, NULL},
    {"cuda_available", cuda_available, METH_NOARGS, NULL},
    {"_set_error_class", set_error_class, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_fusedrope",
                                       "libfusedrope binding (internal; use the fusedrope package)",
                                       -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fusedrope(void)
{
    if (PyType_Ready(&CacheType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "HEADER_VERSION_NUMBER", FUSEDROPE_VERSION_NUMBER) < 0 ||
        PyModule_AddObjectRef(m, "CacheHandle", (PyObject *)&CacheType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    /* A free-threaded CPython would turn the GIL back on for a module that
     * does not say it needs none.  Nothing here needs it: a call's state is
     * its own, the library calls already run without the GIL, a CacheHandle
     * is not changed after it is made (the call's argument holds it alive),
     * and fr_error is set once, by the package's import. */
    if (PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
