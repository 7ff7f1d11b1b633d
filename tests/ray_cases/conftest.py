"""Ray cases: collected only inside the loopback-only namespaces that tests/test_ray.py makes."""

import os

if os.environ.get("JIANMU_FAST_RAY_NETNS") != "1":
    collect_ignore_glob = ["test_*.py"]

import pytest


def pytest_collection_modifyitems(items):
    # Ray's own modules warn about their deprecations while starting (seen: DataContext's
    # `use_push_based_shuffle`); those are Ray's to fix, not failures of ours.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning"))
        item.add_marker(pytest.mark.filterwarnings("ignore::FutureWarning"))
