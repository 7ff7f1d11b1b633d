"""``Skill`` and the ``SKILL.md`` parser.

A skill is a directory holding ``SKILL.md``: YAML front matter between two ``---`` lines,
then the instructions in Markdown. Every other file in the directory (recursively, hidden
files and directories excluded) is a resource, listed relative to the directory, sorted::

    ---
    name: pdf-report
    description: Turn a table of figures into a PDF report.
    type: prompt        # or bt (a behaviour tree the runtime executes); default prompt
    always: false       # true: an "active" skill, always shown in full
    ---
    1. Read the table ...

Front matter keys other than these four are kept in ``Skill.metadata``.

Files are read confined (:mod:`jianmu_fast._safe_fs`): ``SKILL.md`` and the skill
directory are opened beneath the skills root, a symlink that leads out of it, a hard link or
anything but a regular file is refused, and ``SKILL.md`` is capped at
:data:`DEFAULT_MAX_SKILL_BYTES` (``ConfigError`` naming the file).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Mapping, Optional, Union

from .._safe_fs import UnsafePathError, open_beneath, open_regular, open_root, read_capped
from ..errors import ConfigError

__all__ = [
    "Skill",
    "SkillType",
    "parse_skill_md",
    "load_skill",
    "load_skill_in",
    "SKILL_FILE",
    "DEFAULT_MAX_SKILL_BYTES",
    "MAX_RESOURCES",
]

logger = logging.getLogger("jianmu_fast.skills")

SKILL_FILE = "SKILL.md"
#: the largest ``SKILL.md`` read (bytes); a larger one is a ``ConfigError`` naming it
DEFAULT_MAX_SKILL_BYTES = 256 * 1024
#: at most this many resource files of one skill are listed
MAX_RESOURCES = 10_000
SkillType = Literal["prompt", "bt"]
_KNOWN = ("name", "description", "type", "always")


@dataclass(frozen=True)
class Skill:
    """One parsed skill.

    >>> s = Skill(name="greet", description="Say hello.", instructions="Say hello warmly.")
    >>> s.type, s.always, s.resources
    ('prompt', False, ())
    """

    name: str
    """Unique name within a skill set (front matter ``name``)."""
    description: str
    """One line saying when to use the skill; shown in the index."""
    instructions: str = ""
    """The Markdown body of ``SKILL.md``, without the front matter."""
    type: SkillType = "prompt"
    """``prompt``: instructions the model follows; ``bt``: a behaviour tree the runtime runs."""
    always: bool = False
    """``True``: an active skill, rendered in full under ``# Active Skills``."""
    path: Union[Path, None] = None
    """The ``SKILL.md`` file (absolute), or ``None`` for a skill built in code."""
    resources: tuple[str, ...] = ()
    """Files beside ``SKILL.md``, relative to its directory, POSIX separators, sorted."""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Other front matter keys, as parsed."""

    def __post_init__(self) -> None:
        where = f"skill {self.name!r}" if isinstance(self.name, str) else "skill"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"{where}: name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"{where}: description must be a string, got {type(self.description).__name__}")
        if not isinstance(self.instructions, str):
            raise ValueError(f"{where}: instructions must be a string, got {type(self.instructions).__name__}")
        if self.type not in ("prompt", "bt"):
            raise ValueError(f"{where}: type must be 'prompt' or 'bt', got {self.type!r}")
        if not isinstance(self.always, bool):
            raise ValueError(f"{where}: always must be true or false, got {self.always!r}")
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path))
        object.__setattr__(self, "resources", tuple(self.resources))

    @property
    def directory(self) -> Union[Path, None]:
        """The skill's directory (where its resources live), or ``None``.

        >>> Skill("a", "b", path="/s/a/SKILL.md").directory.as_posix()
        '/s/a'
        """
        return None if self.path is None else self.path.parent


def _split_front_matter(text: str, where: str) -> tuple[str, str, int]:
    """``(front matter, body, line where the front matter starts)``."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ConfigError(
            f"{where}:1: SKILL.md must start with a '---' line, then YAML front matter "
            "(name, description), then a closing '---' line"
        )
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:]), 2
    raise ConfigError(f"{where}:1: the front matter opened on line 1 is never closed with a '---' line")


def parse_skill_md(text: str, path: Union[str, os.PathLike[str], None] = None) -> Skill:
    """Parse the text of a ``SKILL.md`` (``path`` names it in errors and becomes ``Skill.path``).

    Raises ``ConfigError`` naming the file (and line, for YAML errors) when the front
    matter is missing, malformed, or lacks ``name`` / ``description``.

    >>> s = parse_skill_md("---\\nname: greet\\ndescription: Say hello.\\nalways: true\\n---\\nBe warm.\\n")
    >>> s.name, s.always, s.instructions
    ('greet', True, 'Be warm.')
    """
    import yaml  # type: ignore[import-untyped]  # lazy: importing jianmu_fast does not load pyyaml

    where = str(path) if path is not None else "<SKILL.md>"
    head, body, first_line = _split_front_matter(text, where)
    from ..config.loader import safe_yaml_compose

    try:
        meta = safe_yaml_compose(head)[1]  # bounded: no alias bomb, no deep nesting
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + first_line}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}{line}: malformed front matter: {problem}") from exc
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: the front matter must be a mapping with name and description")
    for key in ("name", "description"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            raise ConfigError(f"{where}: front matter '{key}' is required and must be a non-empty string")
    try:
        return Skill(
            name=meta["name"].strip(),
            description=" ".join(meta["description"].split()),
            instructions=body.strip("\n").rstrip(),
            type=meta.get("type", "prompt") if meta.get("type") is not None else "prompt",
            always=meta.get("always", False) if meta.get("always") is not None else False,
            path=None if path is None else Path(os.path.abspath(path)),
            metadata={k: v for k, v in meta.items() if k not in _KNOWN},
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _resources(dir_fd: int, directory: Path, confine: Optional[tuple[int, str, list[str]]] = None) -> tuple[str, ...]:
    """Files beneath the open directory ``dir_fd`` (hidden ones and ``SKILL.md`` excluded),
    walked without following symlinked directories; a symlinked file is listed only when it
    resolves beneath ``confine`` (``(root fd, root real path, parts of the directory)``,
    default: the skill directory itself). At most :data:`MAX_RESOURCES` are listed."""
    root_fd, root_real, base = confine if confine is not None else (dir_fd, os.path.realpath(directory), [])
    out: list[str] = []
    for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = PurePosixPath(dirpath)
        for name in sorted(filenames):
            if name.startswith(".") or (name == SKILL_FILE and rel == PurePosixPath(".")):
                continue
            relname = (rel / name).as_posix()
            try:
                is_link = stat.S_ISLNK(os.lstat(name, dir_fd=dfd).st_mode)
            except OSError:
                continue
            if is_link:
                try:
                    open_beneath(root_fd, base + [p for p in relname.split("/") if p != "."], root_real).close()
                except (UnsafePathError, OSError) as exc:
                    reason = exc.reason if isinstance(exc, UnsafePathError) else str(exc)
                    logger.warning("skill resource %s skipped: %s", directory / relname, reason)
                    continue
            out.append(relname)
            if len(out) > MAX_RESOURCES:
                logger.warning(
                    "skill directory %s holds more than %d resource files; only the first %d are listed",
                    directory, MAX_RESOURCES, MAX_RESOURCES,
                )
                return tuple(sorted(out[:MAX_RESOURCES]))
    return tuple(sorted(out))


def _read_skill_md(root_fd: int, parts: list[str], root_real: str, where: Path, max_bytes: int) -> str:
    """The text of ``SKILL.md`` opened confined beneath the root, at most ``max_bytes``."""
    try:
        handle = open_regular(root_fd, parts, root_real)
    except UnsafePathError as exc:
        raise ConfigError(f"{where}: SKILL.md refused: {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read SKILL.md: {exc.strerror or exc}") from exc
    with handle:
        size = handle.st.st_size
        data = b"" if size > max_bytes else read_capped(handle.fd, max_bytes + 1)
    if size > max_bytes or len(data) > max_bytes:
        raise ConfigError(
            f"{where}: SKILL.md is {max(size, len(data))} bytes, over the {max_bytes}-byte limit "
            "(max_bytes); keep the instructions short and move long material into resource files"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not valid UTF-8 at byte {exc.start}; save SKILL.md as UTF-8") from exc


def load_skill_in(root_fd: int, root_real: str, entry: str, root: Path, max_bytes: int = DEFAULT_MAX_SKILL_BYTES) -> Skill:
    """Load the skill directory ``entry`` of the skills root open as ``root_fd`` (real path
    ``root_real``): the directory and its ``SKILL.md`` are opened confined beneath the root
    (:mod:`jianmu_fast._safe_fs`); a symlink leading out of it is a ``ConfigError``."""
    where = root / entry / SKILL_FILE
    try:
        d = open_beneath(root_fd, [entry], root_real)
    except UnsafePathError as exc:
        raise ConfigError(f"{root / entry}: skill directory refused: {exc.reason}") from None
    except (FileNotFoundError, NotADirectoryError):
        raise  # gone, or not a directory: not a skill (the caller decides)
    except OSError as exc:
        raise ConfigError(f"{root / entry}: cannot open the skill directory: {exc.strerror or exc}") from exc
    with d:
        if not stat.S_ISDIR(d.st.st_mode):
            raise ConfigError(f"{root / entry}: not a directory")
        text = _read_skill_md(root_fd, [entry, SKILL_FILE], root_real, where, max_bytes)
        skill = parse_skill_md(text, where)
        return replace(skill, resources=_resources(d.fd, root / entry, (root_fd, root_real, [entry])))


def load_skill(skill_md: Union[str, os.PathLike[str]], *, max_bytes: int = DEFAULT_MAX_SKILL_BYTES) -> Skill:
    """Read and parse one ``SKILL.md``, listing the resources beside it.

    The file is opened beneath its directory without following a symlink out of it, and
    must be a regular file of at most ``max_bytes`` (``ConfigError`` naming it otherwise).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "greet"; d.mkdir()
    >>> _ = (d / "SKILL.md").write_text("---\\nname: greet\\ndescription: Say hello.\\n---\\nBe warm.\\n")
    >>> _ = (d / "phrases.txt").write_text("hi")
    >>> load_skill(d / "SKILL.md").resources
    ('phrases.txt',)
    >>> try:
    ...     load_skill(d / "SKILL.md", max_bytes=10)
    ... except ConfigError as exc:
    ...     print(str(exc).split(": ")[1])
    SKILL.md is 53 bytes, over the 10-byte limit (max_bytes); keep the instructions short and move long material into resource files
    """
    max_bytes = _check_max_bytes(max_bytes)
    p = Path(os.path.abspath(skill_md))
    try:
        d = open_root(p.parent)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read SKILL.md: {exc.strerror or exc}") from exc
    with d:
        real = os.path.realpath(p.parent)
        text = _read_skill_md(d.fd, [p.name], real, p, max_bytes)
        return replace(parse_skill_md(text, p), resources=_resources(d.fd, p.parent))


def _check_max_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_bytes must be a positive int (bytes), got {value!r}")
    return value
