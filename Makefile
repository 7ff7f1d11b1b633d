# Two entry points: `make run` and `make test`. Each creates .venv, installs the package
# with its compiled core, and runs. After editing csrc/*.pyx, `make install` rebuilds.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jianmu_fast-installed
BENCH_STAMP := $(VENV)/.jianmu_fast-bench-installed

.PHONY: install run test bench clean

$(STAMP): pyproject.toml setup.py csrc/_filter_core.pyx
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	$(PY) -c "import jianmu_fast, sys; assert jianmu_fast.BACKEND == 'cython', jianmu_fast.BACKEND; print('jianmu_fast', jianmu_fast.__version__, 'backend', jianmu_fast.BACKEND)"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	mkdir -p out
	$(VENV)/bin/jianmu-fast build examples/conversations.jsonl -o out/prompts.jsonl \
		--preset react --tools-desc-file examples/tools_desc.txt --max-tokens 4000
	@echo "prompts written to out/prompts.jsonl"

test: $(STAMP)
	$(PY) -m pytest -q
	JIANMU_FAST_PURE_PYTHON=1 JIANMU_FAST_MAX_EXAMPLES=200 $(PY) -m pytest -q

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	mkdir -p out
	$(PY) -m pytest benchmarks --benchmark-disable-gc -q --benchmark-json=out/bench.json; status=$$?; \
	$(PY) benchmarks/report.py out/bench.json benchmarks/RESULTS.md; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info jianmu_fast/*.so
