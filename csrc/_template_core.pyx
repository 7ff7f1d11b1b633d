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

include "../jianmu_fast/_template_core_py.py"
