"""Writing the output: whole lines only, SIGINT held back while a chunk is written, and a file
output replaced atomically when the run ends (never the input)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from typing import Any, Iterator, Optional

from .common import UsageError

__all__ = ["Output"]


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold back SIGINT (Ctrl-C) until the block ends, so a write is never cut mid-line.

    Only in the main thread (where Python runs signal handlers); elsewhere a no-op. A SIGINT
    that arrived inside the block is handed to the previous handler when it ends (by default
    ``KeyboardInterrupt``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _input_stat(path: str) -> Optional[os.stat_result]:
    """``os.stat`` of the input (of stdin when ``-`` and it is a regular file), or None."""
    try:
        if path != "-":
            return os.stat(path)
        st = os.fstat(sys.stdin.fileno())
        return st if stat.S_ISREG(st.st_mode) else None
    except (OSError, ValueError, AttributeError):  # no such file (reported later), no real stdin
        return None


class Output:
    """Where the prompts go.

    - ``-``: stdout. Only whole lines are written: each chunk of lines goes out in one write
      that SIGINT cannot interrupt.
    - A regular file (or a new path): lines go to a temporary file in the target's directory,
      which replaces the target (``os.replace``) when the run ends, with the previous file's
      permission bits (a new file gets ``0o666 & ~umask``). ``abort()`` (an interrupted run)
      removes it, so a previous output is never left half-written. A symlink target is
      written through: the file it points to is replaced.
    - Anything else that exists (``/dev/null``, a FIFO): written directly.

    Refuses (``UsageError``) an output that is the input file, whatever the name (same
    device and inode: the same path, a symlink or a hard link to it).
    """

    def __init__(self, path: str, input_path: str) -> None:
        self.path = path
        self._tmp: Optional[str] = None
        self._target = path
        self._mode: Optional[int] = None
        if path == "-":
            self._stream: Any = getattr(sys.stdout, "buffer", None)
            return
        try:
            st: Optional[os.stat_result] = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise UsageError(f"-o {path!r}: {exc.strerror or exc}") from None
        src = _input_stat(input_path)
        if st is not None and src is not None and _same_file(st, src):
            what = "standard input" if input_path == "-" else f"the input {input_path!r}"
            raise UsageError(
                f"-o {path!r} is the same file as {what}: writing it would destroy the input. "
                "Write the prompts to another path."
            )
        if st is not None and not stat.S_ISREG(st.st_mode):
            self._stream = self._open(path, "wb")
            return
        self._target = os.path.realpath(path)
        self._mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        directory = os.path.dirname(self._target)
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self._target)}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise UsageError(f"-o {path!r}: cannot create a file in {directory!r}: {exc.strerror or exc}") from None
        self._stream = os.fdopen(fd, "wb")

    @staticmethod
    def _open(path: str, mode: str) -> Any:
        try:
            return open(path, mode)
        except OSError as exc:
            raise UsageError(f"-o {path!r}: {exc.strerror or exc}") from None

    def write(self, data: bytes) -> None:
        """Write ``data`` (whole lines); SIGINT waits until it is written and flushed."""
        if not data:
            return
        with _sigint_deferred():
            if self._stream is None:  # a text-only stdout (an embedding application)
                sys.stdout.write(data.decode("utf-8"))
                sys.stdout.flush()
            else:
                if self.path == "-":
                    sys.stdout.flush()
                view = memoryview(data)
                while view:  # a write interrupted by a signal can return early, having written part
                    written = self._stream.write(view)
                    view = view[len(view) if written is None else written:]
                self._stream.flush()

    def commit(self) -> None:
        """The run ended (normally or at a bad line): put the file in place."""
        if self.path == "-":
            return
        if self._tmp is not None:
            os.fsync(self._stream.fileno())  # the data is on disk before the name points at it
        self._stream.close()
        if self._tmp is not None:
            assert self._mode is not None
            os.chmod(self._tmp, self._mode)
            os.replace(self._tmp, self._target)
            self._tmp = None

    def abort(self) -> None:
        """The run was interrupted or crashed: leave whatever was at the target untouched."""
        if self.path == "-":
            return
        with contextlib.suppress(OSError):
            self._stream.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None
