/* weightio._speedups: fast paths in C for the JSON weightio reads most (optional; weightio works
   without it: weightio/_native.py loads it).

   `safetensors_header` reads a header that is *plain*: a JSON object whose strings hold no
   backslash escape, whose numbers are non-negative integers of at most 18 digits, whose members
   are tensor entries of exactly {dtype, shape, data_offsets} (any order, each once) and at most
   one "__metadata__" object of strings, with no key twice; each entry of a known dtype code, at
   most `max_ndim` dimensions and a byte span that is non-empty and exactly its size; at most
   `max_tensors` tensors, and no name or metadata key longer than `max_name_bytes` in UTF-8.
   `plain_safetensors` reads a file's header from its first bytes (those MappedFile reads at open)
   when they are certainly a safetensors file to sniff and hold the whole header, as
   `safetensors_header` reads it.
   `index_json` reads a plain sharded-checkpoint index: a "weight_map" object of strings and a
   "metadata" object of scalars. Anything else returns None, and the caller reads the input the
   Python way, which accepts or refuses it with its own words: these functions refuse nothing and
   accept only what those paths accept, with the same result (checked by differential tests, and
   for headers a differential fuzz harness). On Linux and macOS, `_files.h` adds `file_stamp` (the
   part of an fstat the changed-file check compares), and `mapped_slice` and `plain_get` (the
   zero-copy views of `TensorView.numpy()` and `VarBuilder.get`'s shortest path).

   Safety: the input is a bytes object read through its length only (_json_scan.h); no recursion
   (the grammars above have a fixed depth of three); every number is bounded before it is used (18
   digits, products checked for overflow); every object built is owned by the result or released
   on every exit. Nothing is allocated from a number in the file: sizes come from the input's
   length. */

#include "_json_scan.h"

#define MAX_RANK 64 /* numpy's limit; the caller's max_ndim may not exceed it */

typedef struct {
    const char *code;
    Py_ssize_t code_length;
    uint64_t shape[MAX_RANK];
    int rank;
    uint64_t begin, end;
} Entry;

enum { DTYPE = 1, SHAPE = 2, OFFSETS = 4 };

typedef struct { /* what entry_field has read of one entry */
    Entry *entry;
    int max_ndim, seen;
} Fields;

static int entry_field(Cursor *c, const char *key, Py_ssize_t n, void *state) {
    Fields *f = state;
    Entry *e = f->entry;
    uint64_t offsets[2];
    if (is_key(key, n, "dtype") && !(f->seen & DTYPE)) {
        if (!string_bytes(c, &e->code, &e->code_length))
            return 0;
        f->seen |= DTYPE;
    } else if (is_key(key, n, "shape") && !(f->seen & SHAPE)) {
        if ((e->rank = integers(c, e->shape, f->max_ndim)) < 0)
            return 0;
        f->seen |= SHAPE;
    } else if (is_key(key, n, "data_offsets") && !(f->seen & OFFSETS)) {
        if (integers(c, offsets, 2) != 2)
            return 0;
        e->begin = offsets[0];
        e->end = offsets[1];
        f->seen |= OFFSETS;
    } else {
        return 0; /* another field, or one twice */
    }
    return 1;
}

/* One tensor entry's object: exactly its three fields, each once. 1, or 0 (not plain). */
static int read_entry(Cursor *c, Entry *e, int max_ndim) {
    Fields f = {e, max_ndim, 0};
    return object(c, entry_field, &f) && f.seen == (DTYPE | SHAPE | OFFSETS);
}

/* The (bits, dtype) row of the entry's code (kept in *last_row, with its code in *last_code): a
   tuple, or NULL (unknown code; or an error set). */
static PyObject *code_row(const Entry *e, PyObject *codes, PyObject **last_code, PyObject **last_row) {
    if (same_ascii(*last_code, e->code, e->code_length))
        return *last_row;
    PyObject *code = text(e->code, e->code_length);
    if (code == NULL)
        return NULL;
    PyObject *row = PyDict_GetItemWithError(codes, code);
    if (row == NULL || !PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2 || !PyLong_Check(PyTuple_GET_ITEM(row, 0))) {
        Py_DECREF(code);
        return NULL;
    }
    Py_XSETREF(*last_code, code);
    Py_XSETREF(*last_row, Py_NewRef(row));
    return row;
}

/* a * b into *out, or 0 when it overflows 64 bits (portable: no compiler builtin). */
static inline int multiply(uint64_t a, uint64_t b, uint64_t *out) {
    if (b != 0 && a > UINT64_MAX / b)
        return 0;
    *out = a * b;
    return 1;
}

/* The entry's element count times its bits equals its span in bits, with no overflow on the way. */
static int sized(const Entry *e, uint64_t bits) {
    uint64_t count = 1;
    for (int i = 0; i < e->rank; i++)
        if (!multiply(count, e->shape[i], &count))
            return 0;
    if (!multiply(count, bits, &count))
        return 0;
    return e->begin < e->end && count == (e->end - e->begin) * 8;
}

/* info_type((dtype, shape, offset, nbytes, None, None)), built as tuple.__new__ builds it. Both
   tuples are left out of the cyclic garbage collector (as it leaves out, when it first meets them,
   tuples that hold only such objects): they hold ints, None and a dtype, none of which can refer
   back to them, and 100k of them would otherwise be traversed again and again as they age. */
static PyObject *new_info(PyTypeObject *info_type, PyObject *dtype, const Entry *e, uint64_t data_start) {
    PyObject *shape = PyTuple_New(e->rank);
    if (shape == NULL)
        return NULL;
    for (int i = 0; i < e->rank; i++) {
        PyObject *d = PyLong_FromUnsignedLongLong(e->shape[i]);
        if (d == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    PyObject_GC_UnTrack(shape);
    PyObject *offset = PyLong_FromUnsignedLongLong(data_start + e->begin);
    PyObject *nbytes = PyLong_FromUnsignedLongLong(e->end - e->begin);
    PyObject *info = info_type->tp_alloc(info_type, 6);
    if (offset == NULL || nbytes == NULL || info == NULL) {
        Py_DECREF(shape);
        Py_XDECREF(offset);
        Py_XDECREF(nbytes);
        Py_XDECREF(info);
        return NULL;
    }
    Py_INCREF(dtype);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(info, 0, dtype);
    PyTuple_SET_ITEM(info, 1, shape);
    PyTuple_SET_ITEM(info, 2, offset);
    PyTuple_SET_ITEM(info, 3, nbytes);
    PyTuple_SET_ITEM(info, 4, Py_None);
    PyTuple_SET_ITEM(info, 5, Py_None);
#if PY_VERSION_HEX >= 0x030E0000
    ((PyTupleObject *)info)->ob_hash = -1; /* 3.14 caches a tuple's hash: -1 is "not computed yet" */
#endif
    PyObject_GC_UnTrack(info);
    return info;
}

typedef struct {
    PyObject *codes;
    PyTypeObject *info_type;
    int max_ndim;
    Py_ssize_t max_tensors, max_name_bytes;
    uint64_t data_start;
    PyObject *tensors, *metadata;
    PyObject *last_code, *last_row;
    uint64_t expected;
    int ordered, has_metadata;
} Header;

/* One member of the header object: the metadata, or a tensor added to `h->tensors`. 1, or 0. */
static int read_member(Cursor *c, const char *key, Py_ssize_t n, void *state) {
    Header *h = state;
    Entry e;
    if (n > h->max_name_bytes)
        return 0; /* (the key "__metadata__" is held to the limit too, as the Python paths hold it) */
    if (is_key(key, n, "__metadata__")) {
        if (h->has_metadata)
            return 0;
        h->has_metadata = 1;
        return flat_object(c, h->metadata, 1, h->max_name_bytes); /* (strings only) */
    }
    if (n == 0 || PyDict_GET_SIZE(h->tensors) >= h->max_tensors || !read_entry(c, &e, h->max_ndim))
        return 0;
    PyObject *row = code_row(&e, h->codes, &h->last_code, &h->last_row);
    if (row == NULL)
        return 0;
    uint64_t bits = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 0));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!sized(&e, bits))
        return 0;
    if (e.begin != h->expected)
        h->ordered = 0;
    h->expected = e.end;
    PyObject *name = text(key, n);
    if (name == NULL)
        return 0;
    PyObject *info = new_info(h->info_type, PyTuple_GET_ITEM(row, 1), &e, h->data_start);
    if (info == NULL) {
        Py_DECREF(name);
        return 0;
    }
    Py_ssize_t before = PyDict_GET_SIZE(h->tensors);
    int failed = PyDict_SetItem(h->tensors, name, info);
    Py_DECREF(name);
    Py_DECREF(info);
    return !failed && PyDict_GET_SIZE(h->tensors) > before; /* (a name twice: not plain) */
}

PyDoc_STRVAR(safetensors_header_doc,
"safetensors_header(header, data_start, codes, info_type, max_ndim, max_tensors, max_name_bytes)\n--\n\n"
"A plain safetensors header (bytes) read in C: (tensors, metadata, ordered, expected), or None.\n\n"
"tensors: name -> info_type((dtype, shape, data_start + begin, end - begin, None, None)) in header\n"
"order, where codes[dtype code] is (bits, dtype); metadata: the __metadata__ strings; ordered: each\n"
"tensor begins where the one before it ends; expected: the last one's end. None: the header is not\n"
"plain (see the module source); the caller then reads it the Python way.");

/* A tuple subclass whose instances are bare tuples (no __dict__, no slots): what new_info fills. */
static int bare_tuple_type(PyTypeObject *t) {
    if (!PyType_IsSubtype(t, &PyTuple_Type) || t->tp_basicsize != PyTuple_Type.tp_basicsize || t->tp_dictoffset != 0)
        return 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (t->tp_flags & Py_TPFLAGS_MANAGED_DICT)
        return 0;
#endif
    return 1;
}

/* The plain header `buf[0:len]` into `h` (its codes, info_type, limits and data_start set; its
   tensors and metadata made here, released by header_clear): 1, 0 not plain (no error), -1 an error. */
static int parse_header(Header *h, const unsigned char *buf, Py_ssize_t len) {
    h->ordered = 1;
    h->tensors = PyDict_New();
    h->metadata = PyDict_New();
    if (h->tensors == NULL || h->metadata == NULL)
        return -1;
    Cursor c = {buf, buf + len};
    if (!document(&c, read_member, h))
        return PyErr_Occurred() ? -1 : 0;
    return 1;
}

static void header_clear(Header *h) {
    Py_XDECREF(h->tensors);
    Py_XDECREF(h->metadata);
    Py_XDECREF(h->last_code);
    Py_XDECREF(h->last_row);
}

/* The checks both entry points make of info_type and the limits: 1, or 0 with ValueError set. */
static int header_arguments(Header *h, Py_ssize_t data_start) {
    if (!bare_tuple_type(h->info_type) || data_start < 0 || h->max_ndim < 0 || h->max_ndim > MAX_RANK ||
        h->max_tensors < 0 || h->max_name_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "info_type must be a tuple subclass without a __dict__ or slots; "
                                          "max_ndim 0..64; data_start and the limits >= 0");
        return 0;
    }
    h->data_start = (uint64_t)data_start;
    return 1;
}

/* What parse_header found, as both entry points return it: (tensors, metadata, ordered, expected)
   when `parsed` is 1, None when 0, NULL (the error set) when -1. */
static PyObject *header_result(const Header *h, int parsed) {
    if (parsed == 1)
        return Py_BuildValue("(OONK)", h->tensors, h->metadata, PyBool_FromLong(h->ordered),
                             (unsigned long long)h->expected);
    return parsed == 0 ? Py_NewRef(Py_None) : NULL;
}

static PyObject *safetensors_header(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t data_start;
    Header h = {0};
    if (!PyArg_ParseTuple(args, "y*nO!O!inn:safetensors_header", &view, &data_start, &PyDict_Type, &h.codes,
                          &PyType_Type, &h.info_type, &h.max_ndim, &h.max_tensors, &h.max_name_bytes))
        return NULL;
    PyObject *result = NULL;
    int parsed = header_arguments(&h, data_start) ? parse_header(&h, view.buf, view.len) : -1;
    result = header_result(&h, parsed);
    header_clear(&h);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(plain_safetensors_doc,
"plain_safetensors(head, size, prefixes, checksum_bytes, codes, info_type, max_ndim, max_tensors,\n"
"                  max_name_bytes, max_header)\n--\n\n"
"A safetensors file's header read from its first bytes `head` (of a file of `size` bytes: all of\n"
"them, or at least the first 512, which sniff looks at): what safetensors_header returns for it,\n"
"(tensors, metadata, ordered, expected), when `head` is one that sniff calls safetensors without a\n"
"doubt (see vouched below: `prefixes`, the magic numbers sniff knows, and `checksum_bytes`, what a\n"
"tar checksum field may hold, are sniff's), holds the whole header (its length at most max_header\n"
"and within the file) and the header is plain; the caller checks the tensors cover the data\n"
"section. None for anything else: the caller sniffs and reads the file the usual way, which reads\n"
"it or says what is wrong.");

/* Whether sniff is sure to call the file that starts with `p` (its first `n` bytes, all of them or
   at least 512) safetensors: a '{' right after the 8-byte length (byte 8: no whitespace before
   it), none of the magic numbers it tests first, and no first 512-byte block that tarfile could
   open (what torch.load tries on any file not a zip): not a base-256 checksum, not all zeros (byte
   8 is '{'), and a checksum field (bytes 148..155, up to a NUL) holding a byte that int(field, 8)
   cannot get past, so that tarfile refuses it. */
static int vouched(const unsigned char *p, Py_ssize_t n, PyObject *prefixes, const Py_buffer *checks) {
    if (n < 9 || p[8] != '{')
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        PyObject *prefix = PyTuple_GET_ITEM(prefixes, i);
        if (!PyBytes_CheckExact(prefix))
            return 0;
        Py_ssize_t length = PyBytes_GET_SIZE(prefix);
        if (n >= length && memcmp(p, PyBytes_AS_STRING(prefix), (size_t)length) == 0)
            return 0;
    }
    if (n < 512)
        return 1; /* (tarfile refuses a file shorter than a block) */
    if (p[148] == 0x80 || p[148] == 0xff)
        return 0;
    for (int i = 148; i < 156 && p[i] != 0; i++)
        if (memchr(checks->buf, p[i], (size_t)checks->len) == NULL)
            return 1;
    return 0;
}

static PyObject *plain_safetensors(PyObject *module, PyObject *args) {
    Py_buffer view, checks;
    Py_ssize_t size, max_header;
    PyObject *prefixes;
    Header h = {0};
    if (!PyArg_ParseTuple(args, "y*nO!y*O!O!innn:plain_safetensors", &view, &size, &PyTuple_Type, &prefixes,
                          &checks, &PyDict_Type, &h.codes, &PyType_Type, &h.info_type, &h.max_ndim, &h.max_tensors,
                          &h.max_name_bytes, &max_header))
        return NULL;
    const unsigned char *p = view.buf;
    PyObject *result = NULL;
    uint64_t n = 0;
    for (int i = 7; i >= 0 && view.len >= 8; i--)
        n = n << 8 | p[i];
    if (!header_arguments(&h, 0)) /* (checked whatever the bytes: a ValueError, as safetensors_header's) */
        goto done;
    /* `head` the file's first bytes, all of them or at least the 512 sniff looks at (the tar test
       needs them); the header's length at most max_header and within both the file and `head`:
       else the usual way says what is wrong, or reads a header longer than `head` */
    if (max_header < 0 || size < view.len || (view.len < 512 && view.len != size) ||
        !vouched(p, view.len, prefixes, &checks) || n > (uint64_t)max_header || n > (uint64_t)(view.len - 8)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    h.data_start = 8 + n;
    result = header_result(&h, parse_header(&h, p + 8, (Py_ssize_t)n));
done:
    header_clear(&h);
    PyBuffer_Release(&view);
    PyBuffer_Release(&checks);
    return result;
}

/* ----------------------------------------------------------------------------- index files */

PyDoc_STRVAR(index_json_doc,
"index_json(text)\n--\n\n"
"A plain sharded-checkpoint index (bytes) as json.loads reads it, or None.\n\n"
"Plain: an object of at most a \"metadata\" object of scalars (strings without escapes, integers\n"
"of at most 18 digits, true, false, null) and a \"weight_map\" object of strings without escapes,\n"
"no key twice, valid UTF-8. Anything else is None: the caller parses it the Python way, which\n"
"accepts or refuses it with its own words.");

/* One member of an index: "weight_map" (strings) or "metadata" (scalars) into `index`, once. */
static int index_member(Cursor *c, const char *key, Py_ssize_t n, void *index) {
    int strings = is_key(key, n, "weight_map");
    if (!strings && !is_key(key, n, "metadata"))
        return 0;
    PyObject *name = PyUnicode_FromStringAndSize(key, n), *value = NULL;
    int ok = 0;
    if (name != NULL && PyDict_Contains(index, name) == 0 && (value = PyDict_New()) != NULL &&
        PyDict_SetItem(index, name, value) == 0)
        ok = flat_object(c, value, strings, PY_SSIZE_T_MAX);
    Py_XDECREF(name);
    Py_XDECREF(value);
    return ok;
}

static PyObject *index_json(PyObject *module, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:index_json", &view))
        return NULL;
    PyObject *index = PyDict_New(), *result = NULL;
    if (index != NULL) {
        Cursor c = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
        if (document(&c, index_member, index))
            result = Py_NewRef(index);
        else if (!PyErr_Occurred())
            result = Py_NewRef(Py_None);
    }
    Py_XDECREF(index);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(place_doc,
"place(placed, readers, info_type)\n--\n\n"
"Fill the empty dict `placed` with name -> (info, i, serial) for every name and info of\n"
"readers[i].tensors (a list of readers, each `tensors` a dict of str -> `info_type`; serial counts\n"
"the names from 0, readers in order, each in its own order: the name's place in `placed`), in one\n"
"step no thread sees half done: the triples are made in a dict of this call's own with the cyclic\n"
"garbage collector off (so no finalizer, and no other thread, runs meanwhile), then moved into\n"
"`placed` by one update. Each triple is untracked by the collector, and so `placed` is too: an info\n"
"holds data only (a dtype, tuples of ints, ints, None, a str, as every reader makes it) and no\n"
"triple is part of any cycle, so a 90k-name map adds nothing to a collection. True when filled (or\n"
"already filled), False where it declined (a `tensors` not a dict, a name not a str, an info of\n"
"another type): the caller fills it.");

/* place's triples for `tables` (each reader's `tensors`, exact dicts) in a new dict, or NULL: an error
   set, or none (declined). The caller has the collector off: nothing here runs Python code. */
static PyObject *placed_triples(PyObject *tables, PyObject *info_type) {
    Py_ssize_t serial = 0, names = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tables); i++)
        names += PyDict_GET_SIZE(PyList_GET_ITEM(tables, i));
    PyObject *built = _PyDict_NewPresized(names); /* (sized once: no resize while it fills) */
    for (Py_ssize_t i = 0; built != NULL && i < PyList_GET_SIZE(tables); i++) {
        PyObject *index = PyLong_FromSsize_t(i), *name, *info, *triple = NULL, *number = NULL;
        Py_ssize_t at = 0;
        int ok = index != NULL;
        while (ok && PyDict_Next(PyList_GET_ITEM(tables, i), &at, &name, &info)) {
            /* (a str subclass's __eq__ or __hash__ would run code; another info type may hold anything) */
            ok = PyUnicode_CheckExact(name) && Py_TYPE(info) == (PyTypeObject *)info_type &&
                 (number = PyLong_FromSsize_t(serial++)) != NULL;
            if (ok) {
                triple = PyTuple_Pack(3, info, index, number);
                Py_DECREF(number);
            }
            if (triple != NULL)
                PyObject_GC_UnTrack(triple); /* (before it is stored: a tracked value would make `built` tracked) */
            ok = ok && triple != NULL && PyDict_SetItem(built, name, triple) == 0;
            Py_XDECREF(triple);
            triple = NULL;
        }
        Py_XDECREF(index);
        if (!ok)
            Py_CLEAR(built);
    }
    return built;
}

static PyObject *place(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "place(placed, readers, info_type): a dict, a list and a type");
        return NULL;
    }
    PyObject *placed = args[0];
    if (PyDict_GET_SIZE(placed))
        Py_RETURN_TRUE;
    PyObject *tables = PySequence_List(args[1]); /* (the attributes read below may run Python code) */
    if (tables == NULL)
        return NULL;
    int filled = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tables) && filled > 0; i++) {
        PyObject *tensors = PyObject_GetAttrString(PyList_GET_ITEM(tables, i), "tensors");
        filled = tensors == NULL ? -1 : PyDict_CheckExact(tensors);
        if (tensors != NULL)
            PyList_SetItem(tables, i, tensors); /* (steals `tensors`; releases the reader's reference) */
    }
    if (filled > 0 && PyDict_GET_SIZE(placed) == 0) { /* (not filled by another thread meanwhile) */
        int collecting = PyGC_Disable();
        PyObject *built = placed_triples(tables, args[2]);
        if (collecting)
            PyGC_Enable();
        if (built == NULL)
            filled = PyErr_Occurred() ? -1 : 0;
        else if (PyDict_Update(placed, built) < 0) { /* (str keys, untracked values: runs no code) */
            PyDict_Clear(placed); /* (a resize that failed part-way leaves nothing half filled) */
            filled = -1;
        }
        Py_XDECREF(built);
    }
    Py_DECREF(tables);
    return filled < 0 ? NULL : PyBool_FromLong(filled);
}

#if defined(__linux__) || defined(__APPLE__)
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include "_files.h"
#include "_reads.h"
#endif

static PyMethodDef methods[] = {
    {"safetensors_header", safetensors_header, METH_VARARGS, safetensors_header_doc},
    {"plain_safetensors", plain_safetensors, METH_VARARGS, plain_safetensors_doc},
    {"index_json", index_json, METH_VARARGS, index_json_doc},
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, place_doc},
#if defined(__linux__) || defined(__APPLE__)
    {"file_stamp", file_stamp, METH_O, file_stamp_doc},
    {"open_head", (PyCFunction)(void (*)(void))open_head, METH_FASTCALL, open_head_doc},
    {"mapped_slice", (PyCFunction)(void (*)(void))mapped_slice, METH_FASTCALL, mapped_slice_doc},
    {"plain_get", (PyCFunction)(void (*)(void))plain_get, METH_FASTCALL, plain_get_doc},
    {"read_pieces", (PyCFunction)(void (*)(void))read_pieces, METH_FASTCALL, read_pieces_doc},
    {"array_root", array_root, METH_O, array_root_doc},
    {"kernel_copies", kernel_copies, METH_NOARGS, kernel_copies_doc},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "weightio._speedups",
    .m_doc = "weightio's optional C fast paths (see weightio/_speedups.c); weightio works without them.",
    .m_size = -1,
    .m_methods = methods,
};

/* VERSION: the interface this source implements; weightio uses a built module only when it matches
   (an in-place build left over from an older source is not called). */
PyMODINIT_FUNC PyInit__speedups(void) {
#if defined(__linux__) || defined(__APPLE__)
    import_array(); /* numpy's C API (numpy is imported by weightio anyway); on failure: not loaded */
    if (files_init() < 0)
        return NULL;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 14) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
