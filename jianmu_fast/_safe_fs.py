"""Confined, race-free file reads beneath a trusted root directory.

Every read of a user-controlled tree (the workspace's bootstrap files, a skills directory)
goes through :func:`open_beneath`: the path is walked one component at a time, each
component opened relative to the file descriptor of the directory before it with
``O_NOFOLLOW``, so no path is ever checked and then used (nothing an attacker swaps between
two system calls can redirect a read). A symlink met on the way is read with ``readlink``
and resolved by the same walk: it may lead anywhere *beneath the root* (relative targets, or
absolute ones that spell a path under the root's real path), never above it; ``..`` may not
climb above the root. The final object is opened ``O_NONBLOCK`` (a FIFO never blocks) and
checked with ``fstat``: only a regular file with one link is accepted (a hard link may point
at a file outside the root, and nothing inside can tell where: refused). Reads are capped
(:func:`read_capped`) from the same descriptor.

Refusals raise :class:`UnsafePathError` (its ``reason`` says why, in words a log line can
use); a missing file raises ``FileNotFoundError``, a path through something that is not a
directory ``NotADirectoryError``; other ``OSError`` pass through.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "a.md").write_text("hello")
>>> with open_root(root) as rfd, open_regular(rfd.fd, "a.md") as f:
...     read_capped(f.fd, 3)
b'hel'
>>> with open_root(root) as rfd:
...     open_regular(rfd.fd, "../etc/passwd")
Traceback (most recent call last):
...
jianmu_fast._safe_fs.UnsafePathError: '..' leads outside the root
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from pathlib import PurePosixPath
from typing import Any, Optional, Union

__all__ = [
    "UnsafePathError",
    "FileHandle",
    "open_root",
    "open_beneath",
    "open_regular",
    "read_capped",
    "relative_parts",
    "MAX_SYMLINKS",
]

MAX_SYMLINKS = 40
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class UnsafePathError(Exception):
    """A path that leaves the root, or names something that is not a plain regular file.

    >>> str(UnsafePathError("it is a FIFO"))
    'it is a FIFO'
    """

    @property
    def reason(self) -> str:
        """Why the path was refused."""
        return str(self.args[0]) if self.args else "refused"


class FileHandle:
    """An open file descriptor (``fd``) and its ``fstat`` result (``st``); a context manager
    that closes the descriptor.

    >>> import tempfile
    >>> with open_root(tempfile.gettempdir()) as h:
    ...     stat.S_ISDIR(h.st.st_mode)
    True
    """

    __slots__ = ("fd", "st")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        try:
            self.st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> "FileHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_root(path: Union[str, "os.PathLike[str]"]) -> FileHandle:
    """Open the trusted root directory (symlinks in its own path are followed).

    >>> import tempfile
    >>> open_root(tempfile.gettempdir()).close()
    """
    return FileHandle(os.open(os.fspath(path), os.O_RDONLY | _DIRECTORY | _CLOEXEC))


def relative_parts(entry: str, root: Union[str, "os.PathLike[str]"], root_real: Optional[str] = None) -> list[str]:
    """The components of ``entry`` relative to ``root``: as given when relative; for an
    absolute path, what follows ``root`` (or its real path ``root_real``), else
    :class:`UnsafePathError`. ``..`` components are refused.

    >>> relative_parts("docs/A.md", "/ws"), relative_parts("/ws/docs/A.md", "/ws")
    (['docs', 'A.md'], ['docs', 'A.md'])
    >>> relative_parts("/etc/passwd", "/ws")
    Traceback (most recent call last):
    ...
    jianmu_fast._safe_fs.UnsafePathError: it is an absolute path outside /ws
    """
    pure = PurePosixPath(entry)
    if ".." in pure.parts:
        raise UnsafePathError("'..' is not allowed")
    if not pure.is_absolute():
        return [p for p in pure.parts if p not in ("", ".")]
    for base in (os.path.abspath(root), root_real):
        if base is None:
            continue
        bparts = PurePosixPath(base).parts
        if pure.parts[: len(bparts)] == bparts:
            return list(pure.parts[len(bparts):])
    raise UnsafePathError(f"it is an absolute path outside {root_real or os.path.abspath(root)}")


def _components(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def open_beneath(root_fd: int, parts: Union[str, list[str]], root_real: Optional[str] = None) -> FileHandle:
    """Open ``parts`` (a relative path, or its components) beneath the directory ``root_fd``
    without following any symlink out of it; the final object is opened ``O_RDONLY |
    O_NONBLOCK`` and may be anything (check ``handle.st``).

    ``root_real``, the root's real path, lets an absolute symlink target that spells a path
    under the root be followed; without it every absolute target is refused.
    """
    todo: deque[str] = deque(_components(parts) if isinstance(parts, str) else parts)
    stack = [os.dup(root_fd)]
    links = 0
    link: Optional[str] = None  # the last symlink followed
    try:
        while todo:
            name = todo.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) == 1:
                    if link is not None:
                        raise UnsafePathError(f"symlink {link!r} leads outside the root")
                    raise UnsafePathError("'..' leads outside the root")
                os.close(stack.pop())
                continue
            if "/" in name or "\0" in name:
                raise UnsafePathError(f"bad path component {name!r}")
            last = not todo
            flags = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | (_NONBLOCK if last else _DIRECTORY)
            try:
                fd = os.open(name, flags, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    raise exc from None  # not a symlink: NotADirectoryError, or the loop error
                links += 1
                link = name
                if links > MAX_SYMLINKS:
                    raise UnsafePathError(f"more than {MAX_SYMLINKS} symlinks") from None
                tparts = PurePosixPath(target).parts
                if target.startswith("/"):
                    rparts = PurePosixPath(root_real).parts if root_real else None
                    if rparts is None or tparts[: len(rparts)] != rparts:
                        raise UnsafePathError(f"symlink {name!r} points to {target}, outside the root") from None
                    for d in stack[1:]:
                        os.close(d)
                    del stack[1:]
                    tparts = tparts[len(rparts):]
                todo.extendleft(reversed([p for p in tparts if p not in ("", ".")]))
                continue
            if last:
                handle = FileHandle(fd)
                return handle
            stack.append(fd)
        # the path named the root itself (or climbed back to a directory): hand out a copy
        return FileHandle(os.dup(stack[-1]))
    finally:
        for d in stack:
            os.close(d)


def open_regular(root_fd: int, parts: Union[str, list[str]], root_real: Optional[str] = None) -> FileHandle:
    """:func:`open_beneath`, then refuse anything but a regular file with one link.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "d").mkdir()
    >>> with open_root(root) as r:
    ...     open_regular(r.fd, "d")
    Traceback (most recent call last):
    ...
    jianmu_fast._safe_fs.UnsafePathError: it is not a regular file (a directory)
    """
    h = open_beneath(root_fd, parts, root_real)
    try:
        mode = h.st.st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a special file"
            )
            raise UnsafePathError(f"it is not a regular file ({kind})")
        if h.st.st_nlink > 1:
            raise UnsafePathError(
                f"it is a hard link ({h.st.st_nlink} links): it may be a file outside the root; "
                "copy the file instead of linking it"
            )
    except BaseException:
        h.close()
        raise
    return h


def read_capped(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (read in pieces; never more than ``limit`` held).

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     _ = f.write(b"abcdef"); _ = f.seek(0)
    ...     read_capped(f.fileno(), 4)
    b'abcd'
    """
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        try:
            piece = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            break
        if not piece:
            break
        chunks.append(piece)
        left -= len(piece)
    return b"".join(chunks)
