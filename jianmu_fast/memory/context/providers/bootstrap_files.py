"""``BootstrapFilesProvider``: workspace files (``AGENTS.md``, ...) as one system message.

The workspace root is, first match wins: the ``workspace_dir`` argument,
``ctx.prompt_runtime.workspace_dir``, ``paths.workspace_dir`` of ``jianmu.yaml``, the
current working directory. The files are the ``files`` argument, else
``prompt.bootstrap_files`` of ``jianmu.yaml`` (default ``["AGENTS.md"]``), read in that order.

Confinement (:mod:`jianmu_fast._safe_fs`): each entry is opened one path component at a
time, relative to the descriptor of the directory before it, with ``O_NOFOLLOW``; a symlink
is followed only while it stays beneath the root, so nothing swapped on the path between
two reads can lead outside it. An entry with a ``..`` component, an absolute path elsewhere,
a symlink that escapes, a hard link (a regular file with more than one link: it may be a file
outside the workspace), or something that is not a regular file is skipped with a warning on
logger ``jianmu_fast.context`` naming the entry; a missing file is skipped with a debug record.

Rendering: each file becomes ``## <entry>\\n\\n<content>`` (trailing newlines stripped;
empty files skipped), joined by a blank line into one system message. Each file is capped
at ``max_bytes`` and all of them together at ``max_total_bytes`` of UTF-8; a cut is made on
a character boundary and followed by a visible ``[... truncated ...]`` line. Invalid UTF-8
is decoded with U+FFFD replacement characters. Contents are cached per entry and
``(device, inode, mtime_ns, size)`` of the opened file, so a hot loop opens and fstats the
files but does not re-read them.

The provider always reads when it runs; the presets add it to a chain only when
``PromptRuntimeContext.include_bootstrap_files`` is true.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from ...._safe_fs import UnsafePathError, open_regular, open_root, read_capped, relative_parts
from ....message import Message, system
from ..runtime import prompt_runtime_of

__all__ = ["BootstrapFilesProvider", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_TOTAL_BYTES"]

logger = logging.getLogger("jianmu_fast.context")

DEFAULT_MAX_BYTES = 32 * 1024
DEFAULT_MAX_TOTAL_BYTES = 128 * 1024


def _check_limit(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int (bytes), got {value!r}")
    return value


def _cut(data: bytes, limit: int) -> bytes:
    """``data[:limit]``, moved back so that no UTF-8 character is split."""
    if len(data) <= limit:
        return data
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut]


class BootstrapFilesProvider:
    """Read workspace files and render them as one system message.

    >>> import tempfile, pathlib
    >>> ws = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (ws / "AGENTS.md").write_text("Run `make test` before committing.\\n")
    >>> print(BootstrapFilesProvider(workspace_dir=ws).get_messages({})[0].content)
    ## AGENTS.md
    <BLANKLINE>
    Run `make test` before committing.
    """

    def __init__(
        self,
        files: Optional[Sequence[str]] = None,
        workspace_dir: Optional[str | os.PathLike[str]] = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> None:
        if files is not None:
            if isinstance(files, (str, bytes)) or not isinstance(files, Sequence):
                raise TypeError(f"files: expected a list of file names, got {type(files).__name__}")
            for i, f in enumerate(files):
                if not isinstance(f, (str, os.PathLike)) or not os.fspath(f):
                    raise TypeError(f"files[{i}]: expected a non-empty file name, got {f!r}")
            files = [os.fspath(f) for f in files]
        if workspace_dir is not None and not isinstance(workspace_dir, (str, os.PathLike)):
            raise TypeError(f"workspace_dir: expected a str or a path, got {type(workspace_dir).__name__}")
        self.files: Optional[list[str]] = files
        self.workspace_dir = None if workspace_dir is None else os.fspath(workspace_dir)
        self.max_bytes = _check_limit("max_bytes", max_bytes)
        self.max_total_bytes = _check_limit("max_total_bytes", max_total_bytes)
        self._contents: dict[str, tuple[tuple[int, int, int, int], str, int]] = {}
        self._rendered: Optional[tuple[tuple[Any, ...], Message]] = None

    def __repr__(self) -> str:
        return f"BootstrapFilesProvider(files={self.files!r}, workspace_dir={self.workspace_dir!r})"

    # -- resolution -----------------------------------------------------------------------

    def _root(self, ctx: Any) -> Path:
        if self.workspace_dir is not None:
            return Path(self.workspace_dir)
        rp = prompt_runtime_of(ctx)
        if rp is not None and rp.workspace_dir is not None:
            return Path(rp.workspace_dir)
        from ....config.loader import load_config

        configured = load_config().paths.get("workspace_dir")
        return Path(configured) if configured else Path.cwd()

    def _entries(self) -> list[str]:
        if self.files is not None:
            return self.files
        from ....config.prompts import bootstrap_files

        return bootstrap_files()

    def _read(
        self, entry: str, root: Path, root_real: str, root_fd: int
    ) -> Optional[tuple[tuple[int, int, int, int], str, int]]:
        """``((dev, ino, mtime_ns, size), text, bytes kept)`` of ``entry`` opened confined
        beneath the root (see :mod:`jianmu_fast._safe_fs`), at most ``max_bytes`` read."""
        try:
            parts = relative_parts(entry, root, root_real)
            handle = open_regular(root_fd, parts, root_real)
        except UnsafePathError as exc:
            reason = exc.reason
            if reason == "'..' is not allowed":
                reason = "'..' is not allowed in bootstrap file names"
            elif "outside" in reason:
                reason = f"{reason}: outside the workspace {root_real}"
            logger.warning("bootstrap file %r skipped: %s", entry, reason)
            return None
        except FileNotFoundError:
            logger.debug("bootstrap file %r skipped: it does not exist in %s", entry, root_real)
            return None
        except OSError as exc:
            logger.warning("bootstrap file %r skipped: cannot open it in %s: %s", entry, root_real, exc)
            return None
        with handle:
            st = handle.st
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._contents.get(entry)
            if cached is not None and cached[0] == key:
                return cached
            try:
                data = read_capped(handle.fd, self.max_bytes + 4)
            except OSError as exc:
                logger.warning("bootstrap file %r skipped: cannot read it: %s", entry, exc)
                return None
        kept = _cut(data, self.max_bytes)
        text = kept.decode("utf-8", errors="replace").rstrip("\n")
        if len(kept) < len(data):
            text += (
                f"\n\n[... truncated: {entry} is {st.st_size} bytes; only the first {len(kept)} "
                "bytes are shown ...]"
            )
        value = (key, text, len(kept))
        self._contents[entry] = value
        return value

    # -- the provider ---------------------------------------------------------------------

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Message]:
        """Return ``[system("## <file>\\n\\n<content>\\n\\n## <file2>...")]``, or ``[]`` when
        no configured file could be read."""
        root = self._root(ctx)
        root_real = os.path.realpath(root)
        parts: list[tuple[str, str, int]] = []
        signature: list[Any] = [root_real, self.max_bytes, self.max_total_bytes]
        seen: set[tuple[int, int]] = set()
        try:
            root_handle = open_root(root_real)
        except OSError as exc:
            logger.warning("bootstrap files skipped: cannot open the workspace %s: %s", root_real, exc)
            return []
        with root_handle:
            for entry in self._entries():
                got = self._read(entry, root, root_real, root_handle.fd)
                if got is None:
                    continue
                key, text, nbytes = got
                if key[:2] in seen:
                    logger.debug("bootstrap file %r skipped: the same file is already included", entry)
                    continue
                seen.add(key[:2])
                if not text.strip():
                    logger.debug("bootstrap file %r skipped: it is empty", entry)
                    continue
                parts.append((entry, text, nbytes))
                signature.append((entry, key))
        if not parts:
            return []
        sig = tuple(signature)
        if self._rendered is not None and self._rendered[0] == sig:
            return [self._rendered[1]]
        message = system(self._render(parts))
        self._rendered = (sig, message)
        return [message]

    def _render(self, parts: list[tuple[str, str, int]]) -> str:
        blocks: list[str] = []
        used = 0
        for i, (entry, text, _) in enumerate(parts):
            body = text.encode("utf-8")
            left = self.max_total_bytes - used
            if left <= 0:
                rest = ", ".join(e for e, _, _ in parts[i:])
                blocks.append(
                    f"[... truncated: the {self.max_total_bytes}-byte limit for workspace files is "
                    f"reached; not shown: {rest} ...]"
                )
                break
            if len(body) > left:
                kept = _cut(body, left).decode("utf-8", errors="replace").rstrip("\n")
                text = (
                    f"{kept}\n\n[... truncated: the {self.max_total_bytes}-byte limit for workspace "
                    f"files is reached inside {entry} ...]"
                )
                used = self.max_total_bytes
            else:
                used += len(body)
            blocks.append(f"## {entry}\n\n{text}")
        return "\n\n".join(blocks)
