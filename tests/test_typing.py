"""Type checkers see the installed package, the development install included (issue 14 item 4).

``make`` installs the package editable in setuptools' "compat" mode: a path entry in a
``.pth`` file, which mypy follows (the default editable mode installs an import hook that
no type checker can see). The check runs mypy with this interpreter on a script outside the
source tree, so only the install can make ``jianmu_fast`` visible.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mypy", reason="mypy comes with the [test] extra")

SCRIPT = textwrap.dedent(
    """
    from jianmu_fast.memory.context import ContextBuilder, TiktokenTokenCounter
    from jianmu_fast.message import Message, human

    builder = ContextBuilder.for_chat(system_prompt="Be terse.", max_tokens=100,
                                      token_counter=TiktokenTokenCounter("o200k_base"))
    prompt: list[Message] = builder.build({"messages": [human("hi")]})
    wrong: str = builder.build({"messages": []})
    """
)


def test_mypy_sees_the_installed_package(tmp_path):
    script = tmp_path / "use_jianmu_fast.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull,
         "--no-error-summary", "--hide-error-context", script.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    lines = proc.stdout.strip().splitlines()
    assert not any("import-not-found" in line or "import-untyped" in line for line in lines), (
        "mypy cannot see jianmu_fast: reinstall it with `make install` (editable_mode=compat)\n"
        + proc.stdout + proc.stderr
    )
    # exactly the one planted error: mypy read the package's real types (list[Message] is no str)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("use_jianmu_fast.py:8: error: Incompatible types in assignment"), lines[0]
    assert '"list[Message]"' in lines[0], lines[0]
