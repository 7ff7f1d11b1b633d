"""Every ```python block of README.md runs, each on its own (issue 14 item 6).

Each block runs in a fresh namespace (a name defined by another block is a ``NameError``),
from the repository root (a block may read the repository's files, e.g. ``tests/data``),
with ``tempfile`` pointed at a fresh temporary directory; a block that leaves a new entry
in the repository root fails. ``>>>`` blocks run as doctests and must print what they show.
Tracebacks carry README.md line numbers.
"""

from __future__ import annotations

import doctest
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import jianmu_fast

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int  # README line of the first line of code
    heading: str
    code: str

    @property
    def id(self) -> str:
        words = re.findall(r"[A-Za-z0-9]+", self.heading)[:4]
        return f"L{self.line}-{'-'.join(words) or 'top'}"


def readme_blocks(text: str) -> list[Block]:
    blocks = []
    for m in FENCE.finditer(text):
        headings = re.findall(r"^#+ (.*)$", text[: m.start()], re.M)
        line = text.count("\n", 0, m.start(1)) + 1
        blocks.append(Block(line, headings[-1] if headings else "", m.group(1)))
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def run_block(block: Block) -> None:
    """Run one block as the test does: a doctest for ``>>>`` blocks, else ``exec``."""
    if block.code.lstrip().startswith(">>>"):
        # the opening example shows the compiled backend; under JIANMU_FAST_PURE_PYTHON=1 it is 'python'
        example = block.code.replace("'cython'", repr(jianmu_fast.BACKEND))
        test = doctest.DocTestParser().get_doctest(example, {}, f"README.md:{block.line}", str(README),
                                                   block.line - 1)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, out=print)
        assert runner.summarize(verbose=False).failed == 0, f"README.md:{block.line}: doctest failed"
    else:
        code = compile("\n" * (block.line - 1) + block.code, str(README), "exec")
        exec(code, {"__name__": "__readme__"})


def test_readme_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]


def test_every_python_block_is_collected():
    text = README.read_text(encoding="utf-8")
    openings = re.findall(r"^```(py\w*|pycon)\b.*$", text, re.M)
    assert openings == ["python"] * len(BLOCKS), f"code blocks tagged otherwise are not run: {openings}"
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs(block, tmp_path, monkeypatch):
    before = sorted(os.listdir(ROOT))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_block(block)
    created = sorted(set(os.listdir(ROOT)) - set(before))
    assert not created, f"README.md:{block.line}: the block wrote {created} into the repository; use a temporary path"


def test_a_block_that_uses_another_blocks_name_fails():
    with pytest.raises(NameError, match="history"):
        run_block(Block(1, "", "prompt = list(history)\n"))
    with pytest.raises(AssertionError, match="doctest failed"):
        run_block(Block(1, "", ">>> 1 + 1\n3\n"))


def test_relative_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README links to files not in the repository: {missing}"
    assert "docs/CONTRACT.md" in links
    assert "../shared" not in text
