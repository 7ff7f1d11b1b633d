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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Union

from ..errors import ConfigError

__all__ = ["Skill", "SkillType", "parse_skill_md", "load_skill", "SKILL_FILE"]

SKILL_FILE = "SKILL.md"
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
    try:
        meta = yaml.safe_load(head)
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


def _resources(directory: Path) -> tuple[str, ...]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):  # does not follow symlinked dirs
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(directory)
        for name in filenames:
            if name.startswith(".") or (name == SKILL_FILE and rel == Path(".")):
                continue
            out.append((rel / name).as_posix())
    return tuple(sorted(out))


def load_skill(skill_md: Union[str, os.PathLike[str]]) -> Skill:
    """Read and parse one ``SKILL.md``, listing the resources beside it.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "greet"; d.mkdir()
    >>> _ = (d / "SKILL.md").write_text("---\\nname: greet\\ndescription: Say hello.\\n---\\nBe warm.\\n")
    >>> _ = (d / "phrases.txt").write_text("hi")
    >>> load_skill(d / "SKILL.md").resources
    ('phrases.txt',)
    """
    p = Path(os.path.abspath(skill_md))
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not valid UTF-8 at byte {exc.start}; save SKILL.md as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read SKILL.md: {exc}") from exc
    return replace(parse_skill_md(text, p), resources=_resources(p.parent))
