"""Build the compiled filter core; all metadata lives in pyproject.toml.

After editing ``csrc/*.pyx`` run ``pip install -e .`` again (or ``make install``).
``JIANMU_FAST_DEBUG=1`` turns bounds checks on and keeps debug info, for segfault hunts.
``JIANMU_FAST_PGO=generate`` / ``use`` (GCC; what ``make pgo`` runs): a
profile-guided build -- extensions that record where they branch, then, after a training run
(``benchmarks/pgo_train.py``), extensions laid out by that profile (``JIANMU_FAST_PGO_DIR``,
default ``build/pgo``; build in place both times, so that the objects' paths match).
"""

import os
import sys

#: profile-guided optimization (see the module docstring): the compiled cores are Cython's
#: C, ~1 MB of code a hot-loop turn runs through; laid out by a profile, a chat-template
#: turn spends less time fetching it (session 39: ~10-15 % less time a turn)
PGO = os.environ.get("JIANMU_FAST_PGO", "")
PGO_DIR = os.path.abspath(os.environ.get("JIANMU_FAST_PGO_DIR", os.path.join("build", "pgo")))
if PGO and sys.platform == "win32":
    raise SystemExit("JIANMU_FAST_PGO: GCC flags; on Windows build without it")
if PGO not in ("", "generate", "use"):
    raise SystemExit(f"JIANMU_FAST_PGO: expected 'generate' or 'use', got {PGO!r}")
if PGO == "use" and not os.path.isdir(PGO_DIR):
    raise SystemExit(f"JIANMU_FAST_PGO=use: no profile at {PGO_DIR} (build with JIANMU_FAST_PGO=generate "
                     "and run benchmarks/pgo_train.py first, or `make pgo`)")


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

# (the profile's files are named by each object's path from the source root, not from /:
# a build elsewhere -- the wheel ``python -m build`` makes from the sdist in a temporary
# folder, ``make dist PGO=1`` -- finds them)
PGO_PREFIX = f"-fprofile-prefix-path={os.getcwd()}"
if PGO == "generate":
    compile_args += [f"-fprofile-generate={PGO_DIR}", "-fprofile-update=atomic", PGO_PREFIX]
    link_args += [f"-fprofile-generate={PGO_DIR}"]
elif PGO == "use":
    # (a function the training never ran is optimized as usual; a function whose C changed
    # since -- another Cython's output -- is optimized without its profile, silently: GCC
    # warns once per function otherwise, thousands of lines where only line numbers moved)
    compile_args += [f"-fprofile-use={PGO_DIR}", PGO_PREFIX, "-fprofile-correction", "-Wno-missing-profile",
                     "-Wno-coverage-mismatch"]

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
