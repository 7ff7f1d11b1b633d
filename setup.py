"""Build the compiled filter core; all metadata lives in pyproject.toml.

After editing ``csrc/*.pyx`` run ``pip install -e .`` again (or ``make install``).
``JIANMU_FAST_DEBUG=1`` turns bounds checks on and keeps debug info, for segfault hunts.
"""

import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NO_COMPILER = """
jianmu_fast: compiling its core (csrc/_filter_core.pyx, turned into C by Cython) failed:
    {error}
It needs a C compiler and the Python headers:
    Debian/Ubuntu: sudo apt install gcc python3-dev     Fedora/RHEL: sudo dnf install gcc python3-devel
    Alpine: apk add build-base python3-dev              macOS: xcode-select --install
    Windows: the "Desktop development with C++" workload of Visual Studio Build Tools
or install a prebuilt wheel instead (`make dist` builds a manylinux one on any Linux machine).
"""


class BuildExt(build_ext):
    """``build_ext`` whose compiler failure says what to install, instead of pip's generic error."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError) as exc:
            raise SystemExit(NO_COMPILER.format(error=exc)) from exc


DEBUG = os.environ.get("JIANMU_FAST_DEBUG") == "1"

# Ship the extension without debug info (1.3 MB -> ~0.2 MB): compile with -g0 (after
# Python's own -g) and strip at link time. MSVC takes neither flag; JIANMU_FAST_DEBUG keeps both.
compile_args: list[str] = []
link_args: list[str] = []
if not DEBUG and sys.platform != "win32":
    compile_args.append("-g0")
    if sys.platform.startswith("linux"):
        link_args.append("-s")

extensions = [
    Extension(
        "jianmu_fast._filter_core",
        ["csrc/_filter_core.pyx"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    ),
    Extension("jianmu_fast._editing_core", ["csrc/_editing_core.pyx"], extra_compile_args=compile_args, extra_link_args=link_args),
    Extension("jianmu_fast._batch_core", ["csrc/_batch_core.pyx"], extra_compile_args=compile_args, extra_link_args=link_args),
    Extension("jianmu_fast._template_core", ["csrc/_template_core.pyx"], extra_compile_args=compile_args, extra_link_args=link_args),
]

setup(
    cmdclass={"build_ext": BuildExt},
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
