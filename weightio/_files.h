/* weightio._speedups, part two (POSIX): opening a file, the changed-file check and the views of
   `get`'s shortest path.

   `open_head` is MappedFile(head=True)'s first calls (open, fstat, the first bytes read): the one
   function here that reads bytes of a file, at most the caller's `head` of them (never a count read
   from the file), into a bytes object that holds them as read. `file_stamp` is the part of an fstat
   the changed-file check compares, without the nineteen fields os.fstat builds. `mapped_slice` and
   `plain_get` make the zero-copy numpy view that view.stored_array and VarBuilder.get hand out for
   a tensor stored as plain elements, after that check: one array over the element view MappedFile
   caches, made with numpy's C API (its shape's element count checked against the span, the span
   against the view). Like the header readers,
   they refuse nothing: for anything they do not serve (a view not cached yet, another reader or
   file type, a failed fstat, a changed or closed file) they return None and the Python way, which
   checks again, serves or refuses it. They read no byte of the file, and nothing here is allocated
   from a number in it. Included by _speedups.c. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __APPLE__
#define MODIFIED(st) ((st).st_mtimespec)
#else
#define MODIFIED(st) ((st).st_mtim)
#endif

/* sec * 10**9 + nsec as Python computes st_mtime_ns (exact for any sec: beyond +-9e9 in Python ints). */
static PyObject *nanoseconds(long long sec, long nsec) {
    if (sec > -9000000000LL && sec < 9000000000LL)
        return PyLong_FromLongLong(sec * 1000000000LL + nsec);
    PyObject *s = PyLong_FromLongLong(sec), *billion = PyLong_FromLong(1000000000L), *n = PyLong_FromLong(nsec);
    PyObject *scaled = s && billion ? PyNumber_Multiply(s, billion) : NULL;
    PyObject *out = scaled && n ? PyNumber_Add(scaled, n) : NULL;
    Py_XDECREF(s);
    Py_XDECREF(billion);
    Py_XDECREF(n);
    Py_XDECREF(scaled);
    return out;
}

PyDoc_STRVAR(file_stamp_doc,
"file_stamp(fd)\n--\n\n"
"(st_mode, st_size, st_mtime_ns) of os.fstat(fd), without building its whole result; OSError as\n"
"os.fstat raises it. (The changed-file check of every access to a mapping is one of these.)");

static PyObject *file_stamp(PyObject *module, PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < INT_MIN || fd > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "file descriptor out of range");
        return NULL;
    }
    struct stat st;
    int failed, interrupted = 0;
    do { /* as os.fstat: an interrupted call is made again, unless a signal handler raised */
        Py_BEGIN_ALLOW_THREADS
        failed = fstat((int)fd, &st);
        Py_END_ALLOW_THREADS
    } while (failed && errno == EINTR && !(interrupted = PyErr_CheckSignals()));
    if (interrupted)
        return NULL;
    if (failed)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *mode = PyLong_FromLong((long)st.st_mode), *size = PyLong_FromLongLong((long long)st.st_size);
    PyObject *modified = nanoseconds((long long)MODIFIED(st).tv_sec, (long)MODIFIED(st).tv_nsec);
    PyObject *out = mode && size && modified ? PyTuple_New(3) : NULL;
    if (out == NULL) {
        Py_XDECREF(mode);
        Py_XDECREF(size);
        Py_XDECREF(modified);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, mode);
    PyTuple_SET_ITEM(out, 1, size);
    PyTuple_SET_ITEM(out, 2, modified);
    return out;
}

PyDoc_STRVAR(open_head_doc,
"open_head(path, flags, head)\n--\n\n"
"What MappedFile(path, head=True) does first, in one call: os.open(path, flags), the file_stamp of\n"
"the descriptor and its first min(size, head) bytes: (fd, size, mtime_ns, first bytes), the\n"
"descriptor the caller's to close. None, with nothing left open, for a path os.open would not take\n"
"as it is, a failed or interrupted system call, a file that is not regular or is empty, or a read\n"
"that comes back short: the caller's Python way then opens it again and says what is wrong. A\n"
"failed allocation is a MemoryError (nothing left open either).");

/* All of `length` bytes at offset 0 of `fd` into `buffer`, the GIL released: 1, or 0 (an error, an
   interruption or a short file: not retried here). */
static int read_head(int fd, char *buffer, Py_ssize_t length) {
    Py_ssize_t got = 0;
    ssize_t n = 1;
    Py_BEGIN_ALLOW_THREADS
    while (got < length && (n = pread(fd, buffer + got, (size_t)(length - got), (off_t)got)) > 0)
        got += n;
    Py_END_ALLOW_THREADS
    return got == length;
}

static PyObject *open_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "open_head(path, flags, head): a path and two ints");
        return NULL;
    }
    long flags = PyLong_AsLong(args[1]);
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    if (flags < INT_MIN || flags > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "open_head: flags out of range"); /* (as os.open says it) */
        return NULL;
    }
    Py_ssize_t wanted = PyLong_AsSsize_t(args[2]);
    if (wanted == -1 && PyErr_Occurred())
        return NULL;
    if (wanted < 0) {
        PyErr_SetString(PyExc_ValueError, "open_head: a negative head");
        return NULL;
    }
    PyObject *encoded = NULL; /* (str, bytes or os.PathLike, as os.open takes them) */
    if (!PyUnicode_FSConverter(args[0], &encoded)) {
        PyErr_Clear(); /* (an embedded NUL, say: os.open says so) */
        Py_RETURN_NONE;
    }
    int fd;
    struct stat st;
    Py_BEGIN_ALLOW_THREADS
    fd = open(PyBytes_AS_STRING(encoded), (int)flags, 0777); /* (the mode os.open gives, were O_CREAT asked) */
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)) {
        close(fd);
        fd = -1;
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(encoded);
    if (fd < 0)
        Py_RETURN_NONE;
    Py_ssize_t length = (long long)st.st_size < (long long)wanted ? (Py_ssize_t)st.st_size : wanted;
    PyObject *head = PyBytes_FromStringAndSize(NULL, length);
    PyObject *number = PyLong_FromLong(fd), *size = PyLong_FromLongLong((long long)st.st_size);
    PyObject *modified = nanoseconds((long long)MODIFIED(st).tv_sec, (long)MODIFIED(st).tv_nsec);
    PyObject *out = NULL;
    if (head != NULL && number != NULL && size != NULL && modified != NULL) {
        if (read_head(fd, PyBytes_AS_STRING(head), length))
            out = PyTuple_Pack(4, number, size, modified, head);
        else
            out = Py_NewRef(Py_None);
    }
    Py_XDECREF(head);
    Py_XDECREF(number);
    Py_XDECREF(size);
    Py_XDECREF(modified);
    if (out == NULL || out == Py_None)
        close(fd); /* (on an error or a decline nothing stays open; the tuple hands the caller the descriptor) */
    return out;
}

static PyObject *FAST, *CLOSED, *FILE_; /* names, interned at import */

static int files_init(void) {
    return (FAST = PyUnicode_InternFromString("_fast")) == NULL ||
                   (CLOSED = PyUnicode_InternFromString("_closed")) == NULL ||
                   (FILE_ = PyUnicode_InternFromString("file")) == NULL
               ? -1
               : 0;
}

/* The changed-file check of `file` (a MappedFile: `_fast` = (fd, size, mtime_ns, element views),
   `_closed`), `fixed` its `_fast`, whose first three element_slice checked are exact ints: 1
   unchanged and open, 0 not (or not decidable here: the caller's Python way decides), -1 an error
   set. The fstat comes first and `_closed` is read after it, as MappedFile.check does (a close marks
   the file closed before it closes the descriptor, so a reused descriptor number is never taken for
   this file). */
static int unchanged(PyObject *file, PyObject *fixed) {
    int overflow = 0, size_overflow = 0, ns_overflow = 0;
    long fd = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(fixed, 0), &overflow);
    long long size = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(fixed, 1), &size_overflow);
    long long ns = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(fixed, 2), &ns_overflow), now;
    /* a time beyond int64 nanoseconds (past 2262) is not decided here */
    if (overflow || size_overflow || ns_overflow || fd < 0 || fd > INT_MAX)
        return 0;
    struct stat st;
    int failed, interrupted = 0;
    do {
        Py_BEGIN_ALLOW_THREADS
        failed = fstat((int)fd, &st);
        Py_END_ALLOW_THREADS
    } while (failed && errno == EINTR && !(interrupted = PyErr_CheckSignals()));
    if (interrupted)
        return -1;
    if (failed)
        return 0;
    PyObject *closed = PyObject_GetAttr(file, CLOSED);
    if (closed == NULL)
        return -1;
    int is_closed = PyObject_IsTrue(closed);
    Py_DECREF(closed);
    if (is_closed)
        return is_closed < 0 ? -1 : 0;
    return size == (long long)st.st_size &&
           !__builtin_mul_overflow((long long)MODIFIED(st).tv_sec, 1000000000LL, &now) &&
           !__builtin_add_overflow(now, (long long)MODIFIED(st).tv_nsec, &now) && ns == now;
}

/* An exact int within [0, 2**63) as a long long, or -1 (no error set) for anything else. */
static long long count_of(PyObject *number) {
    if (!PyLong_CheckExact(number))
        return -1;
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
    return overflow || value < 0 ? -1 : value; /* (no error is set for an exact int) */
}

/* Elements [first, end) of `file`'s cached element view for `dtype` (a one-dimensional, contiguous,
   read-only ndarray), as one array of the tuple `shape` made by numpy's C API (a slice and a
   reshape through Python cost three times as much), after the changed-file check: a new
   reference, None (a new reference) where the view is not cached, does not hold those elements
   in that shape, or the check fails, or NULL with an error set. */
static PyObject *element_slice(PyObject *file, PyObject *dtype, long long first, long long end, PyObject *shape) {
    PyObject *fixed = PyObject_GetAttr(file, FAST);
    if (fixed == NULL)
        return NULL;
    PyObject *typed = NULL;
    if (PyTuple_CheckExact(fixed) && PyTuple_GET_SIZE(fixed) == 4 && PyLong_CheckExact(PyTuple_GET_ITEM(fixed, 0)) &&
        PyLong_CheckExact(PyTuple_GET_ITEM(fixed, 1)) && PyLong_CheckExact(PyTuple_GET_ITEM(fixed, 2)) &&
        PyDict_CheckExact(PyTuple_GET_ITEM(fixed, 3)))
        typed = PyDict_GetItemWithError(PyTuple_GET_ITEM(fixed, 3), dtype);
    Py_XINCREF(typed); /* (a close empties the cache meanwhile: this view stays valid, and the check says closed) */
    if (typed == NULL) {
        Py_DECREF(fixed);
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    /* the shape's element count, each dimension an exact int (at most 32 of them: numpy 1's limit), and
       the bytes of its non-zero dimensions, which numpy refuses past its index range even for no elements */
    npy_intp dims[32], count = 1, span = 1;
    Py_ssize_t rank = PyTuple_GET_SIZE(shape);
    int fits = PyArray_CheckExact(typed) && PyArray_NDIM((PyArrayObject *)typed) == 1 && rank <= 32 &&
               PyArray_ISCARRAY_RO((PyArrayObject *)typed) &&
               PyArray_STRIDE((PyArrayObject *)typed, 0) == PyArray_ITEMSIZE((PyArrayObject *)typed);
    if (fits)
        span = PyArray_ITEMSIZE((PyArrayObject *)typed);
    for (Py_ssize_t i = 0; fits && i < rank; i++) {
        long long d = count_of(PyTuple_GET_ITEM(shape, i));
        dims[i] = (npy_intp)d;
        fits = d >= 0 && d <= NPY_MAX_INTP && !__builtin_mul_overflow(count, dims[i], &count) &&
               !__builtin_mul_overflow(span, d ? dims[i] : 1, &span);
    }
    /* (never otherwise, for a validated header) */
    fits = fits && first >= 0 && first <= end && end <= (long long)PyArray_DIM((PyArrayObject *)typed, 0) &&
           (long long)count == end - first;
    int same = fits ? unchanged(file, fixed) : 0;
    Py_DECREF(fixed);
    if (same <= 0) {
        Py_DECREF(typed);
        return same < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)typed);
    Py_INCREF(descr); /* (taken by the new array) */
    char *data = PyArray_BYTES((PyArrayObject *)typed) + (npy_intp)first * PyArray_ITEMSIZE((PyArrayObject *)typed);
    /* no flags: read-only, C order (numpy sets contiguity and alignment) */
    PyObject *out = PyArray_NewFromDescr(&PyArray_Type, descr, (int)rank, dims, NULL, data, 0, NULL);
    if (out == NULL || PyArray_SetBaseObject((PyArrayObject *)out, typed) < 0) { /* (takes `typed`) */
        if (out == NULL)
            Py_DECREF(typed);
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

PyDoc_STRVAR(mapped_slice_doc,
"mapped_slice(file, dtype, start, stop, shape)\n--\n\n"
"Elements [start, stop) of a MappedFile's mapping viewed as `dtype` (its cached element view),\n"
"reshaped to the tuple `shape`, after the changed-file check; None where that view is not cached\n"
"(or does not hold those elements), `shape` is not a tuple,\n"
"the file is closed, its fstat fails or its size or modification time changed: the caller then\n"
"goes the Python way, which checks again and says what is wrong. (view.stored_array's slice.)");

static PyObject *mapped_slice(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "mapped_slice takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    long long first = count_of(args[2]), end = count_of(args[3]);
    if (!PyTuple_CheckExact(args[4]) || first < 0 || end < 0)
        Py_RETURN_NONE;
    return element_slice(args[0], args[1], first, end, args[4]);
}

PyDoc_STRVAR(plain_get_doc,
"plain_get(plain, name, shape)\n--\n\n"
"VarBuilder.get's shortest path, as view.plain_get_py does it: the stored tensor head + name as a\n"
"zero-copy numpy view, when its stored shape is `shape` (a tuple of ints), it is viewed as stored\n"
"elements of a local mapped file whose element view is cached, and the changed-file check passes;\n"
"the request counted at the name's serial. None for anything else (the caller's general path serves\n"
"or refuses it). `plain` is a cursor's (placed, readers, usage.stamps, usage.plain, element_sizes,\n"
"plain_readers, MappedFile, usage, head).");

/* The request's record, as Usage.plain_hit makes it, at `serial` of `record` (a bytearray of three
   int64 a name: times, first stamp, last stamp) with the next stamp of `stamps`: 1, 0 where a stamp
   is not a count (never, for an itertools.count), -1 with an error set. With the GIL held throughout,
   no other thread sees the three half updated. */
static int plain_record(PyObject *record, long long serial, PyObject *stamps) {
    PyObject *next = Py_TYPE(stamps)->tp_iternext(stamps);
    if (next == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long long stamp = count_of(next), slots[3];
    Py_DECREF(next); /* (the record's size checked after: another `stamps` than a count could run code) */
    if (stamp <= 0 || serial < 0 || serial >= (long long)(PyByteArray_GET_SIZE(record) / 24))
        return 0;
    char *at = PyByteArray_AS_STRING(record) + serial * (long long)sizeof(slots);
    memcpy(slots, at, sizeof(slots)); /* (a bytearray's storage need not be aligned for int64) */
    if (slots[0] == 0)
        slots[1] = stamp;
    slots[0] += 1;
    slots[2] = stamp;
    memcpy(at, slots, sizeof(slots));
    return 1;
}

static PyObject *plain_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 9 ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(args[0], 8))) {
        PyErr_SetString(PyExc_TypeError, "plain_get(plain, name, shape): plain a tuple of 9, its last a str");
        return NULL;
    }
    PyObject *const *fast = &PyTuple_GET_ITEM(args[0], 0);
    PyObject *head = fast[8], *name = args[1], *shape = args[2];
    PyObject *placed = fast[0], *readers = fast[1], *stamps = fast[2], *record = fast[3];
    PyObject *sizes = fast[4], *plain_readers = fast[5], *mapped = fast[6];
    if (!PyUnicode_CheckExact(name) || PyUnicode_GET_LENGTH(name) == 0 || !PyTuple_CheckExact(shape) ||
        !PyDict_CheckExact(placed) || !PyList_CheckExact(readers) || Py_TYPE(stamps)->tp_iternext == NULL ||
        !PyByteArray_CheckExact(record) || !PyDict_CheckExact(sizes) || !PyDict_CheckExact(plain_readers))
        Py_RETURN_NONE;
    PyObject *full = PyUnicode_GET_LENGTH(head) ? PyUnicode_Concat(head, name) : Py_NewRef(name);
    if (full == NULL)
        return NULL;
    /* (info, index of its reader, serial) in one lookup (`placed`: filled by a first request the
       general way; the info is the index's own too) */
    PyObject *out = NULL, *found = PyDict_GetItemWithError(placed, full), *info = NULL, *reader = NULL;
    long long at = -1, serial = -1;
    if (found != NULL && PyTuple_CheckExact(found) && PyTuple_GET_SIZE(found) == 3) {
        at = count_of(PyTuple_GET_ITEM(found, 1)); /* (-1, no error, for one that is not an int that fits) */
        serial = count_of(PyTuple_GET_ITEM(found, 2));
    }
    if (at >= 0 && at < (long long)PyList_GET_SIZE(readers) && serial >= 0 &&
        serial < (long long)(PyByteArray_GET_SIZE(record) / 24)) {
        info = PyTuple_GET_ITEM(found, 0);
        reader = PyList_GET_ITEM(readers, (Py_ssize_t)at);
    }
    if (info == NULL)
        goto check;
    if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 6)
        goto none;
    /* the shape asked equals the stored one, every dimension an int (a bool, float or numpy int: general path) */
    PyObject *stored_shape = PyTuple_GET_ITEM(info, 1);
    Py_ssize_t rank = PyTuple_GET_SIZE(shape);
    if (!PyTuple_CheckExact(stored_shape) || PyTuple_GET_SIZE(stored_shape) != rank)
        goto none;
    for (Py_ssize_t i = 0; i < rank; i++) {
        PyObject *asked = PyTuple_GET_ITEM(shape, i), *stored = PyTuple_GET_ITEM(stored_shape, i);
        if (!PyLong_CheckExact(asked) || !PyLong_CheckExact(stored))
            goto none;
        int equal = PyObject_RichCompareBool(asked, stored, Py_EQ);
        if (equal <= 0) {
            if (equal < 0)
                goto done;
            goto none;
        }
    }
    PyObject *dtype = PyTuple_GET_ITEM(info, 0);
    if (PyTuple_GET_ITEM(info, 4) != Py_None || PyTuple_GET_ITEM(info, 5) != Py_None)
        goto none; /* strided or quantized */
    PyObject *size_object = PyDict_GetItemWithError(sizes, dtype); /* set by stored_array: viewed as elements */
    if (size_object == NULL)
        goto check;
    if (PyDict_GetItemWithError(plain_readers, (PyObject *)Py_TYPE(reader)) != Py_True)
        goto check; /* a reader whose `buffer` may refuse a name */
    long long size = count_of(size_object), offset = count_of(PyTuple_GET_ITEM(info, 2));
    long long nbytes = count_of(PyTuple_GET_ITEM(info, 3));
    if (size <= 0 || offset < 0 || nbytes < 0 || offset % size)
        goto none;
    Py_INCREF(reader); /* (both held while its attribute is read, whatever that runs: `dtype` is the info's) */
    Py_INCREF(info);
    PyObject *file = PyObject_GetAttr(reader, FILE_);
    Py_DECREF(reader);
    long long first = offset / size, end;
    if (file != NULL && (PyObject *)Py_TYPE(file) == mapped && !__builtin_add_overflow(first, nbytes / size, &end))
        out = element_slice(file, dtype, first, end, shape);
    else if (file != NULL)
        out = Py_NewRef(Py_None);
    Py_XDECREF(file);
    Py_DECREF(info);
    if (out == NULL || out == Py_None)
        goto done;
    int recorded = plain_record(record, serial, stamps); /* (`record` is held by the tuple `plain`) */
    if (recorded <= 0) {
        Py_DECREF(out);
        out = recorded < 0 ? NULL : Py_NewRef(Py_None);
    }
    goto done;
check:
    if (PyErr_Occurred())
        goto done;
none:
    out = Py_NewRef(Py_None);
done:
    Py_DECREF(full);
    return out;
}
