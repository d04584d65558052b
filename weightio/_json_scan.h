/* The JSON scanning primitives of weightio/_speedups.c: a cursor over the input's bytes, and the
   tokens its parsers accept. Each reads only before the cursor's end, and returns 0 (or NULL) for
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
static unsigned char stops[256];

static void make_stops(void) {
    for (int ch = 0; ch < 0x20; ch++)
        stops[ch] = 1;
    stops['"'] = stops['\\'] = 1;
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

#endif /* WEIGHTIO_JSON_SCAN_H */
