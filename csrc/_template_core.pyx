# cython: language_level=3, binding=True, boundscheck=True, wraparound=True, cdivision=False, annotation_typing=False
"""The compiled hot path of ``ChatTemplateTokenCounter``: the source of its pure-Python twin,
``jianmu_fast/_template_core_py.py``, included verbatim (one source, two builds: the
compiled one without the interpreter's per-operation dispatch). Python semantics throughout
(bounds and negative indices checked, Python division, annotations not used as C types)."""

include "../jianmu_fast/_template_core_py.py"
