"""The README's opening example runs and prints what it shows."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import jianmu_fast

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]


def test_readme_example():
    text = README.read_text(encoding="utf-8")
    example = re.search(r"```python\n(>>> .*?)```", text, re.S).group(1)
    # the example shows the compiled backend; under JIANMU_FAST_PURE_PYTHON=1 it prints 'python'
    example = example.replace("'cython'", repr(jianmu_fast.BACKEND))
    test = doctest.DocTestParser().get_doctest(example, {}, "README", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
