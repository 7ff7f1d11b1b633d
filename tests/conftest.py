"""Shared fixtures: the ``core`` fixture runs a test on both filter-core backends."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import jianmu_fast._backend as backend
import jianmu_fast._filter_core_py as core_py
from examples_scale import EXAMPLES_SCALE, scaled_examples

# The ``core`` fixture only swaps a module attribute; it is safe to share across examples.
settings.register_profile("jianmu", suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("jianmu")

PURE = os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1"


def pytest_collection_modifyitems(config, items):
    """Scale every collected hypothesis test's ``max_examples`` (see ``examples_scale``)."""
    if not 0 < EXAMPLES_SCALE <= 1:
        raise pytest.UsageError(f"JIANMU_FAST_EXAMPLES_SCALE must be in (0, 1], got {EXAMPLES_SCALE}")
    if EXAMPLES_SCALE == 1:
        return
    done: set[int] = set()
    for item in items:
        obj = getattr(item, "obj", None)
        test = getattr(obj, "__func__", obj)  # (a method's function)
        if not getattr(test, "is_hypothesis_test", False) or id(test) in done:
            continue
        done.add(id(test))
        # (where hypothesis reads a test's settings when it runs it)
        current = test._hypothesis_internal_use_settings
        test._hypothesis_internal_use_settings = settings(current, max_examples=scaled_examples(current.max_examples))


@pytest.fixture(params=["cython", "python"])
def core(request, monkeypatch):
    """The filter-core module under test; the filters use it for the test's duration.

    The compiled twin is skipped only when the whole run is pure Python
    (``JIANMU_FAST_PURE_PYTHON=1``); otherwise it must import.
    """
    if request.param == "cython":
        if PURE:
            pytest.skip("JIANMU_FAST_PURE_PYTHON=1: the compiled core is not in use")
        import jianmu_fast._filter_core as module
    else:
        module = core_py
    monkeypatch.setattr(backend, "select_window", module.select_window)
    monkeypatch.setattr(backend, "select_windows", module.select_windows)
    monkeypatch.setattr(backend, "Records", module.Records)  # the filters' per-prompt records
    return module


def _sandbox(cwd, monkeypatch):
    from jianmu_fast.config import clear_config_cache

    monkeypatch.delenv("JIANMU_CONFIG", raising=False)
    cwd.mkdir(exist_ok=True)
    monkeypatch.chdir(cwd)
    clear_config_cache()
    yield cwd
    clear_config_cache()


@pytest.fixture
def config_sandbox(tmp_path, monkeypatch):
    """Run in ``tmp_path`` with no ``JIANMU_CONFIG`` and an empty configuration cache."""
    yield from _sandbox(tmp_path, monkeypatch)


@pytest.fixture
def config_sandbox_subdir(tmp_path, monkeypatch):
    """Like ``config_sandbox``, in ``tmp_path / "cwd"`` (so tmp_path can hold files outside it)."""
    yield from _sandbox(tmp_path / "cwd", monkeypatch)
