"""Build the compiled filter core; all metadata lives in pyproject.toml.

After editing ``csrc/*.pyx`` run ``pip install -e .`` again (or ``make install``).
``JIANMU_FAST_DEBUG=1`` turns bounds checks on, for segfault hunts.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("JIANMU_FAST_DEBUG") == "1"

extensions = [Extension("jianmu_fast._filter_core", ["csrc/_filter_core.pyx"])]

setup(
    ext_modules=cythonize(
        extensions,
        build_dir="build/cython",
        compiler_directives={
            "language_level": 3,
            "boundscheck": DEBUG,
            "wraparound": False,
            "cdivision": True,
            "autotestdict": False,
            "embedsignature": True,
        },
    )
)
