# cython: language_level=3, binding=True, boundscheck=True, wraparound=True, cdivision=False, annotation_typing=True, infer_types=True
"""The compiled hot path of ``ChatTemplateTokenCounter``: the source of its pure-Python twin,
``jianmu_fast/_template_core_py.py``, included verbatim (one source, two builds: the
compiled one without the interpreter's per-operation dispatch). Python semantics throughout
(bounds and negative indices checked, Python division); ``infer_types``: a variable assigned
only lengths, indices and their differences is a C ``Py_ssize_t`` (no list length or index
overflows it; the rest stay Python objects: token counts, costs); annotations naming builtin types
(``dict``, ``list``, ``str``, ``tuple``, ``int``) type those variables and arguments as those
Python types (a dict's ``get`` and a list's ``append`` called directly, not looked up; a
value of another type raises ``TypeError``), any other annotation is ignored. The functions
decorated ``@cython.ccall`` (no-ops in the twin) are ``cpdef``: the module's functions call
them in C, without the argument tuple and look-up of a Python call (what a hot-loop turn's
~40 calls between them cost: ~3 % of its instructions); their return annotations type their
results as the arguments' do (``bool``: a C int, returned to Python as ``True``/``False``)."""

from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t, uint16_t, uint32_t

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        pass
    PyTypeObject PyDict_Type
    void PyObject_GC_UnTrack(void *op)
    bint PyObject_GC_IsTracked(object op)
    # (borrowed references, for _json_unchanged_compiled)
    PyTypeObject *_TYPE "Py_TYPE" (PyObject *o)
    PyObject *_TGET "PyTuple_GET_ITEM" (PyObject *p, Py_ssize_t pos)
    Py_ssize_t _TSIZE "PyTuple_GET_SIZE" (PyObject *p)
    PyObject *_LGET "PyList_GET_ITEM" (PyObject *p, Py_ssize_t pos)
    Py_ssize_t _LSIZE "PyList_GET_SIZE" (PyObject *p)
    int _DNEXT "PyDict_Next" (PyObject *p, Py_ssize_t *ppos, PyObject **pkey, PyObject **pvalue)
    Py_ssize_t _DSIZE "PyDict_GET_SIZE" (PyObject *p)
    # (the twin's _weak_ref and _instance_dict, compiled)
    object PyWeakref_NewRef(object ob, object callback)
    object PyObject_GenericGetDict(object o, void *context)
    # (the twin's _dict_get, compiled: a borrowed reference, NULL with an error or none)
    PyObject *PyDict_GetItemWithError(object p, object key) except? NULL


cdef bint _json_untracked(object o):
    """Whether ``o`` is a JSON value that the cyclic garbage collector need not track, its
    containers (exact tuples, lists and dicts: of strings, numbers, booleans, None and such
    containers) untracked bottom-up on the way: none of them can hold a cycle. Anything else
    (a subclass, another object) is False, and so is every container holding it."""
    t = type(o)
    if o is None or t is str or t is int or t is float or t is bool:
        return True
    if t is not tuple and t is not list and t is not dict:
        return False
    if not PyObject_GC_IsTracked(o):
        # (a tuple or dict CPython untracked holds nothing trackable; a list only we untrack)
        return True
    ok = True
    if t is dict:
        for k, v in (<dict>o).items():
            if not (_json_untracked(k) and _json_untracked(v)):
                ok = False
    else:
        for v in o:
            if not _json_untracked(v):
                ok = False
    if ok:
        PyObject_GC_UnTrack(<void *>o)
    return ok


cdef int _put_untracked(dict cache, object key, object value) except -1:
    """``cache[key] = value`` (the twin's ``put_untracked``): an untracked ``cache`` is
    untracked again after the store where ``key`` and ``value`` are not tracked (CPython
    tracks a dict as soon as it holds a dict or a list, tracked or not)."""
    was = PyObject_GC_IsTracked(cache)
    cache[key] = value
    if not was and PyObject_GC_IsTracked(cache) and not PyObject_GC_IsTracked(key) and not PyObject_GC_IsTracked(value):
        PyObject_GC_UnTrack(<void *>cache)
    return 0


cdef object _dict_get_compiled(object d, object k):
    """``dict.get(d, k)`` for a dict or a subclass that reads as one (the twin's ``_dict_get``):
    the C-level look-up, no method call."""
    cdef PyObject *r = PyDict_GetItemWithError(d, k)
    if r is NULL:
        return None
    return <object>r


cdef bint _dict_keys_are(object d, tuple keys) except -1:
    """``tuple(d) == keys`` for a dict or a subclass that iterates as one (the twin's
    ``_keys_are``), its keys compared in place: no new tuple."""
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t i = 0
    cdef PyObject *k
    cdef PyObject *v
    if _DSIZE(<PyObject *>d) != len(keys):
        return False
    while _DNEXT(<PyObject *>d, &pos, &k, &v):
        key = <object>k  # (a reference held: == may run a subclass's code)
        want = keys[i]
        if key is not want and not (key == want):
            return False
        i += 1
    return True


import weakref as _weakref


cdef void _settle_entry_untracked(tuple e):
    """``settle_entry``'s work (see the twin's): the memo entry's weak reference untracked
    where it has no callback, the entry where the rest is untracked already (scalars, and
    containers ``settle`` or CPython untracked)."""
    w = e[0]
    if type(w) is _weakref.ref and w.__callback__ is None:
        if PyObject_GC_IsTracked(w):
            PyObject_GC_UnTrack(<void *>w)
        ok = True
        for i in range(1, len(e)):  # (looked at, not untracked: settle's part; a dict may share the caller's lists)
            v = e[i]
            t = type(v)
            if not (v is None or t is str or t is int or t is float or t is bool
                    or ((t is tuple or t is list or t is dict) and not PyObject_GC_IsTracked(v))):
                ok = False
        if ok and PyObject_GC_IsTracked(e):
            PyObject_GC_UnTrack(<void *>e)


def _json_unchanged_compiled(list snap, o):
    """``json_unchanged`` (see the twin's), on borrowed references: every record, container
    and item compared where it lies, no reference counted, no bounds checked twice (the
    snapshot's own shape: ``json_snapshot``'s list of ``(container, items)`` tuples)."""
    cdef Py_ssize_t i, j, n, pos
    cdef PyObject *k
    cdef PyObject *v
    cdef PyObject *rec
    cdef PyObject *c
    cdef PyObject *x
    cdef PyObject *items
    cdef PyObject *s = <PyObject *>snap
    for i in range(_LSIZE(s)):
        rec = _LGET(s, i)
        c = _TGET(rec, 0)
        items = _TGET(rec, 1)
        x = <PyObject *>o if i == 0 else c
        n = _TSIZE(items)
        if _TYPE(x) != _TYPE(c):
            return False
        if _TYPE(x) == &PyDict_Type:
            if 2 * _DSIZE(x) != n:
                return False
            pos = 0
            j = 0
            while _DNEXT(x, &pos, &k, &v):
                if k != _TGET(items, j) or v != _TGET(items, j + 1):
                    return False
                j += 2
        else:  # (a list: json_snapshot records nothing else)
            if _LSIZE(x) != n:
                return False
            for j in range(n):
                if _LGET(x, j) != _TGET(items, j):
                    return False
    return True


cdef extern from "Python.h":
    # (the str's code units, for _json_escaped_compiled)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    int PyUnicode_KIND(object o)
    void *PyUnicode_DATA(object o)
    Py_UCS4 PyUnicode_MAX_CHAR_VALUE(object o)

ctypedef fused _unit_t:  # (a str's code unit: PyUnicode_1BYTE_KIND, 2BYTE, 4BYTE)
    uint8_t
    uint16_t
    uint32_t

cdef Py_ssize_t _escape_extra(const _unit_t *p, Py_ssize_t n) noexcept nogil:
    """How many characters escaping ``p[:n]`` adds: one for a two-character escape (``"``,
    backslash, newline, carriage return, tab, backspace, form feed), five for a ``\\u00XX``
    one (any other control character). Branch-free: ~0.4 ns a character, where the encoder
    takes ~2 for both passes."""
    cdef Py_ssize_t i, extra = 0
    cdef uint32_t ch, ctl, short
    for i in range(n):
        ch = p[i]
        ctl = <uint32_t>(ch < 0x20)
        short = <uint32_t>(ch == 0x0a) | <uint32_t>(ch == 0x0d) | <uint32_t>(ch == 0x09) | <uint32_t>(ch == 0x08) | <uint32_t>(ch == 0x0c)
        extra += ctl + <uint32_t>(ch == 0x22) + <uint32_t>(ch == 0x5c) + 4 * (ctl & (short ^ 1))
    return extra


cdef void _escape_into(const _unit_t *p, Py_ssize_t n, _unit_t *out) noexcept nogil:
    """``p[:n]`` escaped as ``json.dumps(ensure_ascii=False)`` escapes a string's characters,
    written to ``out`` (room made by ``_escape_extra``)."""
    cdef Py_ssize_t i, j = 0
    cdef uint32_t ch
    cdef const char *hexd = b"0123456789abcdef"
    for i in range(n):
        ch = p[i]
        if ch >= 0x20 and ch != 0x22 and ch != 0x5c:
            out[j] = <_unit_t>ch
            j += 1
            continue
        out[j] = 0x5c
        if ch == 0x22 or ch == 0x5c:
            out[j + 1] = <_unit_t>ch
        elif ch == 0x0a:
            out[j + 1] = 0x6e  # n
        elif ch == 0x0d:
            out[j + 1] = 0x72  # r
        elif ch == 0x09:
            out[j + 1] = 0x74  # t
        elif ch == 0x08:
            out[j + 1] = 0x62  # b
        elif ch == 0x0c:
            out[j + 1] = 0x66  # f
        else:
            out[j + 1] = 0x75  # u00XX
            out[j + 2] = 0x30
            out[j + 3] = 0x30
            out[j + 4] = hexd[ch >> 4]
            out[j + 5] = hexd[ch & 15]
            j += 4
        j += 2


def _json_escaped_compiled(str v):
    """``json_escaped`` (see the twin's): two passes over the code units, in the string's own
    width (the escapes are ASCII: the output's widest character is the input's)."""
    cdef Py_ssize_t n = len(v), extra
    cdef int kind = PyUnicode_KIND(v)
    cdef void *data = PyUnicode_DATA(v)
    if kind == 1:
        extra = _escape_extra(<const uint8_t *>data, n)
    elif kind == 2:
        extra = _escape_extra(<const uint16_t *>data, n)
    else:
        extra = _escape_extra(<const uint32_t *>data, n)
    if extra == 0:
        return v
    out = PyUnicode_New(n + extra, PyUnicode_MAX_CHAR_VALUE(v))
    cdef void *dst = PyUnicode_DATA(out)
    if kind == 1:
        _escape_into(<const uint8_t *>data, n, <uint8_t *>dst)
    elif kind == 2:
        _escape_into(<const uint16_t *>data, n, <uint16_t *>dst)
    else:
        _escape_into(<const uint32_t *>data, n, <uint32_t *>dst)
    return out


include "../jianmu_fast/_template_core_py.py"
