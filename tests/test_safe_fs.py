"""jianmu_fast._safe_fs: the confined opener agrees with the kernel on every path it opens,
and never opens anything outside the root (property test over random trees of links)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples_scale import scaled_examples
from jianmu_fast._safe_fs import UnsafePathError, open_beneath, open_regular, open_root, relative_parts

OPENED: list = []  # paths opened across the examples (the property is not vacuous)
EXAMPLES = 150
NAMES = ["a", "b", "c", "f", "g"]
TARGETS = ["a", "b/f", "..", "../a", "../..", "../../out", "../../out/secret", "c/../f", ".", "a/b", "g"]


@st.composite
def trees(draw):
    """Entries of root/, root/a/ and root/b/: a directory, a file or a symlink (relative, or
    absolute to a place inside or outside the root)."""
    spec = {}
    for d in ("", "a/", "b/"):
        for n in NAMES:
            kind = draw(st.sampled_from(["none", "dir", "file", "link", "abs_in", "abs_out"]))
            spec[d + n] = (kind, draw(st.sampled_from(TARGETS)))
    return spec


def _build(base, spec):
    root = os.path.join(base, "root")
    out = os.path.join(base, "out")
    os.makedirs(os.path.join(root, "a"))
    os.makedirs(os.path.join(root, "b"))
    os.makedirs(out)
    with open(os.path.join(out, "secret"), "w") as f:
        f.write("SECRET")
    for rel, (kind, target) in sorted(spec.items()):
        p = os.path.join(root, rel)
        if os.path.lexists(p) or not os.path.isdir(os.path.dirname(p)):
            continue
        if kind == "dir":
            os.mkdir(p)
        elif kind == "file":
            with open(p, "w") as f:
                f.write(rel)
        elif kind == "link":
            os.symlink(target, p)
        elif kind == "abs_in":
            os.symlink(os.path.join(root, target), p)
        elif kind == "abs_out":
            os.symlink(os.path.join(out, "secret"), p)
    return root, out


@settings(max_examples=EXAMPLES, deadline=None)
@given(trees(), st.lists(st.lists(st.sampled_from(NAMES + [".."]), min_size=1, max_size=4), min_size=1, max_size=8))
def test_opened_files_are_the_kernels_and_inside_the_root(spec, queries):
    base = tempfile.mkdtemp()
    try:
        root, out = _build(base, spec)
        real_root = os.path.realpath(root)
        with open_root(root) as r:
            for parts in queries:
                path = os.path.join(root, *parts)
                try:
                    h = open_beneath(r.fd, list(parts), real_root)
                except (UnsafePathError, OSError):
                    continue
                OPENED.append(parts)
                with h:
                    resolved = os.path.realpath(path)
                    # soundness: what was opened is what the kernel opens, and it is inside
                    assert resolved == real_root or resolved.startswith(real_root + os.sep), (parts, resolved)
                    kst = os.stat(path)
                    assert (h.st.st_dev, h.st.st_ino) == (kst.st_dev, kst.st_ino), parts
    finally:
        shutil.rmtree(base)


def test_the_property_opened_paths_through_symlinks():
    if not OPENED:
        pytest.skip("run together with the property test above")
    # (not vacuous: its random trees and queries open paths; how many varies from run to run --
    # 99 in one CI run of 150 examples, over 100 in most -- so the bar is well below the usual
    # count, for the examples this run runs: see JIANMU_FAST_EXAMPLES_SCALE)
    assert len(OPENED) > scaled_examples(EXAMPLES) // 5


def test_plain_paths_without_links_open(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "x.md").write_text("x")
    with open_root(tmp_path) as r:
        for p in ("d/e/x.md", "./d/e/x.md", ["d", "e", "x.md"], "d/e/../e/x.md"):
            with open_regular(r.fd, p) as h:
                assert os.read(h.fd, 10) == b"x"


def test_relative_parts_refuses_dotdot_and_outside_absolute(tmp_path):
    assert relative_parts(str(tmp_path / "a" / "b"), tmp_path) == ["a", "b"]
    with pytest.raises(UnsafePathError, match="'..' is not allowed"):
        relative_parts("a/../b", tmp_path)
    with pytest.raises(UnsafePathError, match="outside"):
        relative_parts("/etc/passwd", tmp_path)
