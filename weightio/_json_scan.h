/* The JSON scanning primitives of weightio/_speedups.c: a cursor over the input's bytes, the
   tokens its parsers accept, and flat objects of them. Each reads only before the cursor's end, and returns 0 (or NULL) for
   anything it does not accept, consuming what it looked at; the callers then give up on the input
   (return None), so nothing here needs to back up. Included once, by _speedups.c. */

#ifndef WEIGHTIO_JSON_SCAN_H
#define WEIGHTIO_JSON_SCAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIGITS 18 /* < 2^63: no overflow while reading, none in (end - begin) * 8 */

typedef struct {
    const unsigned char *p, *end;
} Cursor;

static inline void skip_space(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

/* The next character (after whitespace) is `ch`: consume it. */
static inline int take(Cursor *c, unsigned char ch) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* The bytes that end a string's plain run: its closing quote, an escape, a control character. */
static const unsigned char stops[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    ['"'] = 1, ['\\'] = 1,
};

/* Whether `s` (a str, or NULL) is the ASCII text of the `n` bytes at `bytes`: a str made from them
   before can be used again (a non-ASCII one is never compared: equal bytes could then be invalid
   UTF-8, which must be refused). */
static inline int same_ascii(PyObject *s, const char *bytes, Py_ssize_t n) {
    return s != NULL && PyUnicode_IS_COMPACT_ASCII(s) && PyUnicode_GET_LENGTH(s) == n &&
           memcmp(PyUnicode_DATA(s), bytes, (size_t)n) == 0;
}

/* A string with no escape and no control character: its bytes (still UTF-8, not yet checked). */
static int string_bytes(Cursor *c, const char **start, Py_ssize_t *length) {
    skip_space(c);
    if (c->p >= c->end || *c->p != '"')
        return 0;
    const unsigned char *s = ++c->p, *p = s, *end = c->end;
    while (p < end && !stops[*p])
        p++;
    c->p = p;
    if (p >= end || *p != '"')
        return 0; /* cut short, an escape or a control character */
    *start = (const char *)s;
    *length = p - s;
    c->p++;
    return 1;
}

/* A non-negative JSON integer of at most MAX_DIGITS digits, not followed by a fraction or exponent. */
static int integer(Cursor *c, uint64_t *value) {
    skip_space(c);
    const unsigned char *start = c->p;
    uint64_t x = 0;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return 0;
    if (*c->p == '0') {
        c->p++;
    } else {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (c->p - start >= MAX_DIGITS)
                return 0;
            x = x * 10 + (uint64_t)(*c->p - '0');
            c->p++;
        }
    }
    if (c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || *c->p == '.' || *c->p == 'e' || *c->p == 'E'))
        return 0; /* a leading zero, a fraction or an exponent */
    *value = x;
    return 1;
}

/* After a member or an element: ',' (1, more follow), `close` (0, the container ends), else -1. */
static inline int next_or_close(Cursor *c, unsigned char close) {
    skip_space(c);
    if (c->p < c->end) {
        unsigned char ch = *c->p++;
        if (ch == ',')
            return 1;
        if (ch == close)
            return 0;
    }
    return -1;
}

/* '[' integers ']': at most `limit` of them into `out`; their count, or -1. */
static int integers(Cursor *c, uint64_t *out, int limit) {
    int n = 0;
    if (!take(c, '['))
        return -1;
    skip_space(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        if (n >= limit || !integer(c, &out[n]))
            return -1;
        n++;
        int more = next_or_close(c, ']');
        if (more < 0)
            return -1;
        if (!more)
            return n;
    }
}

static inline int is_key(const char *s, Py_ssize_t n, const char *key) {
    return (size_t)n == strlen(key) && memcmp(s, key, (size_t)n) == 0;
}

/* A str of UTF-8 bytes; NULL with no error set when they are not valid UTF-8. */
static PyObject *text(const char *s, Py_ssize_t n) {
    PyObject *out = PyUnicode_DecodeUTF8(s, n, "strict");
    if (out == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return out;
}

/* A scalar JSON value as json.loads makes it: a string (no escape), an integer (at most 18 digits,
   optionally negative), true, false or null; NULL with no error set for anything else. */
static PyObject *scalar(Cursor *c) {
    skip_space(c);
    if (c->p >= c->end)
        return NULL;
    unsigned char ch = *c->p;
    if (ch == '"') {
        const char *s;
        Py_ssize_t n;
        return string_bytes(c, &s, &n) ? text(s, n) : NULL;
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int negative = ch == '-';
        uint64_t x;
        c->p += negative;
        if (negative && (c->p >= c->end || *c->p < '0' || *c->p > '9'))
            return NULL; /* (no space, or anything else, between the sign and the digits) */
        if (!integer(c, &x))
            return NULL;
        return negative ? PyLong_FromLongLong(-(long long)x) : PyLong_FromUnsignedLongLong(x);
    }
    static const struct { const char *word; PyObject *value; } words[] = {
        {"true", Py_True}, {"false", Py_False}, {"null", Py_None}};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, words[i].word, n) == 0) {
            c->p += n;
            return Py_NewRef(words[i].value);
        }
    }
    return NULL;
}

/* The value of a member of a flat object: a string (with `strings`; one equal to the last one made,
   `*last`, is that object again: a weight_map names a few shards 100k times) or a scalar. */
static PyObject *member_value(Cursor *c, int strings, PyObject **last) {
    if (!strings)
        return scalar(c);
    const char *s;
    Py_ssize_t n;
    if (!string_bytes(c, &s, &n))
        return NULL;
    if (!same_ascii(*last, s, n)) {
        PyObject *made = text(s, n);
        if (made == NULL)
            return NULL;
        Py_XSETREF(*last, made);
    }
    return Py_NewRef(*last);
}

/* How a parser reads the value of one member of an object (its key's bytes given): 1, or 0 (not
   plain; error set if an allocation failed). */
typedef int (*Member)(Cursor *c, const char *key, Py_ssize_t length, void *state);

/* '{' string ':' value (',' ...)* '}', or '{}': each value read by `member`. 1, or 0. */
static int object(Cursor *c, Member member, void *state) {
    if (!take(c, '{'))
        return 0;
    skip_space(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        const char *key;
        Py_ssize_t n;
        if (!string_bytes(c, &key, &n) || !take(c, ':') || !member(c, key, n, state))
            return 0;
        int more = next_or_close(c, '}');
        if (more <= 0)
            return more == 0;
    }
}

/* A whole document: an `object`, then nothing but whitespace. */
static int document(Cursor *c, Member member, void *state) {
    if (!object(c, member, state))
        return 0;
    skip_space(c);
    return c->p == c->end;
}

typedef struct {
    PyObject *out, *last; /* the dict filled; the last string value made (see member_value) */
    int strings;
    Py_ssize_t max_key;
} Flat;

static int flat_member(Cursor *c, const char *ks, Py_ssize_t kn, void *state) {
    Flat *f = state;
    if (kn > f->max_key)
        return 0;
    PyObject *value = member_value(c, f->strings, &f->last);
    if (value == NULL)
        return 0;
    PyObject *key = text(ks, kn);
    Py_ssize_t before = PyDict_GET_SIZE(f->out);
    int failed = key == NULL || PyDict_SetItem(f->out, key, value) < 0;
    Py_XDECREF(key);
    Py_DECREF(value);
    return !failed && PyDict_GET_SIZE(f->out) > before; /* (a key twice: not plain) */
}

/* A flat object into `out` (empty): values strings only (`strings`) or scalars, no key twice,
   none longer than `max_key` bytes. 1, or 0 (not plain; error set if an allocation failed). */
static int flat_object(Cursor *c, PyObject *out, int strings, Py_ssize_t max_key) {
    Flat f = {out, NULL, strings, max_key};
    int ok = object(c, flat_member, &f);
    Py_XDECREF(f.last);
    return ok;
}

#endif /* WEIGHTIO_JSON_SCAN_H */
