"""Benchmark fixtures: seeded tool-calling conversations of 50, 2,000 and 20,000 messages.

Run with ``.venv/bin/python -m pytest benchmarks --benchmark-disable-gc``. The directory is
put on ``sys.path`` so benchmark modules write ``from traces import make_conversation``
(pytest runs with ``--import-mode=importlib``, which does not add it).
"""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from traces import make_conversation  # noqa: E402

from jianmu_fast.message import Message, coerce_messages  # noqa: E402

__all__ = ["conversation", "REPORT"]

#: lines benchmarks add for the end-of-run summary (figures that are not timings)
REPORT: list[str] = []

SEED = 20261130


def conversation(n_messages: int, seed: int = SEED) -> list[Message]:
    """The seeded conversation of ``n_messages`` as Messages (cached per process)."""
    key = (n_messages, seed)
    if key not in _CACHE:
        _CACHE[key] = coerce_messages(make_conversation(n_messages, seed))
    return _CACHE[key]


_CACHE: dict[tuple[int, int], list[Message]] = {}


@pytest.fixture(scope="session")
def conversation_50() -> list[Message]:
    return conversation(50)


@pytest.fixture(scope="session")
def conversation_2k() -> list[Message]:
    return conversation(2_000)


@pytest.fixture(scope="session")
def conversation_20k() -> list[Message]:
    return conversation(20_000)


@pytest.fixture(scope="session")
def report() -> list[str]:
    """Append a line here to print it in the ``jianmu_fast figures`` summary at the end."""
    return REPORT


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if REPORT:
        terminalreporter.section("jianmu_fast figures")
        for line in REPORT:
            terminalreporter.write_line(line)
