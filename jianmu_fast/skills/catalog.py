"""``SkillsCatalog``: the skills of a directory, in a deterministic order.

``SkillsCatalog.from_dir(root)`` loads ``root/<name>/SKILL.md`` for every non-hidden
subdirectory, in sorted order of directory names. A malformed ``SKILL.md`` is logged (logger
``jianmu_fast.skills``, with its path and the reason) and skipped; the others still load.
Two skills with one name raise ``ConfigError`` naming both files.

Wherever a "skill set" is accepted, a ``SkillsCatalog``, a single ``Skill`` or a list of
``Skill`` will do (:func:`as_skill_list`); a list keeps the order it was given in.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

from .._safe_fs import UnsafePathError, open_beneath, open_root
from ..errors import ConfigError
from .skill import DEFAULT_MAX_SKILL_BYTES, SKILL_FILE, Skill, _check_max_bytes, load_skill_in

__all__ = ["SkillsCatalog", "as_skill_list", "DEFAULT_SKILLS_DIR"]

logger = logging.getLogger("jianmu_fast.skills")

DEFAULT_SKILLS_DIR = "skills"


def _where(skill: Skill) -> str:
    return str(skill.path) if skill.path is not None else f"<skill {skill.name!r} built in code>"


def _check_unique(skills: list[Skill]) -> None:
    seen: dict[str, Skill] = {}
    for s in skills:
        if s.name in seen:
            raise ConfigError(
                f"two skills are named {s.name!r}: {_where(seen[s.name])} and {_where(s)}; "
                "rename one of them (front matter 'name')"
            )
        seen[s.name] = s


def as_skill_list(skill_set: Any) -> list[Skill]:
    """A new list of the skills of ``skill_set`` (``None``, a ``Skill``, a list, a catalog).

    >>> as_skill_list([Skill("b", "B"), Skill("a", "A")])[0].name
    'b'
    >>> as_skill_list(None)
    []
    """
    if skill_set is None:
        return []
    if isinstance(skill_set, SkillsCatalog):
        return list(skill_set.skills)
    if isinstance(skill_set, Skill):
        return [skill_set]
    if isinstance(skill_set, (str, bytes, os.PathLike)) or not isinstance(skill_set, Iterable):
        raise TypeError(
            f"skill_set: expected a SkillsCatalog or a list of Skill, got {type(skill_set).__name__}; "
            "load a directory with SkillsCatalog.from_dir(path)"
        )
    out = list(skill_set)
    for i, s in enumerate(out):
        if not isinstance(s, Skill):
            raise TypeError(f"skill_set[{i}]: expected a Skill, got {type(s).__name__}")
    _check_unique(out)
    return out


class SkillsCatalog:
    """An ordered, name-unique collection of skills.

    >>> cat = SkillsCatalog([Skill("greet", "Say hello.")])
    >>> [s.name for s in cat], "greet" in cat, cat.get("greet").description
    (['greet'], True, 'Say hello.')
    """

    def __init__(self, skills: Iterable[Skill] = (), root: Optional[Union[str, os.PathLike[str]]] = None) -> None:
        self.skills: list[Skill] = as_skill_list(list(skills))
        self.root: Optional[Path] = None if root is None else Path(os.path.abspath(root))

    def __repr__(self) -> str:
        return f"SkillsCatalog({[s.name for s in self.skills]!r}, root={self.root!r})"

    def __iter__(self) -> Iterator[Skill]:
        return iter(self.skills)

    def __len__(self) -> int:
        return len(self.skills)

    def __contains__(self, name: object) -> bool:
        return any(s.name == name for s in self.skills)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SkillsCatalog) and self.skills == other.skills and self.root == other.root

    __hash__ = None  # type: ignore[assignment]

    def get(self, name: str) -> Optional[Skill]:
        """The skill named ``name``, or ``None``.

        >>> SkillsCatalog([Skill("greet", "Say hello.")]).get("nope") is None
        True
        """
        return next((s for s in self.skills if s.name == name), None)

    @classmethod
    def from_dir(
        cls, path: Union[str, os.PathLike[str]], *, missing_ok: bool = False, max_bytes: int = DEFAULT_MAX_SKILL_BYTES
    ) -> "SkillsCatalog":
        """Load every ``<path>/<subdirectory>/SKILL.md``, subdirectories in sorted order.

        A missing directory raises ``ConfigError``, or gives an empty catalog with
        ``missing_ok=True``. Everything is opened confined beneath ``path``
        (:mod:`jianmu_fast._safe_fs`): a skill directory or ``SKILL.md`` that is a symlink
        leading out of it, a hard link, or a ``SKILL.md`` over ``max_bytes`` is skipped with a
        warning naming the file.

        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for n in ("b", "a"):
        ...     (root / n).mkdir()
        ...     _ = (root / n / "SKILL.md").write_text(f"---\\nname: {n}\\ndescription: Skill {n}.\\n---\\nDo {n}.\\n")
        >>> [s.name for s in SkillsCatalog.from_dir(root).skills]
        ['a', 'b']
        """
        max_bytes = _check_max_bytes(max_bytes)
        root = Path(os.path.abspath(path))
        try:
            root_handle = open_root(root)
        except OSError as exc:
            if missing_ok and isinstance(exc, FileNotFoundError):
                logger.debug("skills directory %s does not exist; no skills loaded", root)
                return cls([], root=root)
            raise ConfigError(
                f"skills directory {root} does not exist or is not a directory ({exc.strerror or exc}); "
                "create it, or fix skills_dir (PromptRuntimeContext.skills_dir or paths.skills_dir in jianmu.yaml)"
            ) from None
        skills: list[Skill] = []
        with root_handle:
            root_real = os.path.realpath(root)
            for entry in sorted(os.listdir(root_handle.fd)):
                if entry.startswith("."):
                    continue
                try:
                    with open_beneath(root_handle.fd, [entry, SKILL_FILE], root_real):
                        pass  # present (whatever it is): a skill directory
                except (FileNotFoundError, NotADirectoryError):
                    continue  # no SKILL.md: not a skill
                except (UnsafePathError, OSError):
                    pass  # load_skill_in names the file and the reason
                try:
                    skills.append(load_skill_in(root_handle.fd, root_real, entry, root, max_bytes))
                except (FileNotFoundError, NotADirectoryError):
                    logger.debug("skill directory %s vanished while it was loaded", root / entry)
                except ConfigError as exc:
                    logger.warning("skill %s skipped: %s", root / entry / SKILL_FILE, exc)
        return cls(skills, root=root)

    @classmethod
    def resolve_runtime(cls, runtime_prompt: Any = None, config: Any = None) -> "SkillsCatalog":
        """The catalog a run should use, first match wins:

        1. ``runtime_prompt.skills_catalog`` (a catalog, or a list of ``Skill``);
        2. ``runtime_prompt.skills_dir``;
        3. ``paths.skills_dir`` of ``config`` (default: the ``jianmu.yaml`` in effect);
        4. ``./skills`` in the current working directory (empty catalog when it is absent).

        A directory named by 2 or 3 must exist (``ConfigError`` otherwise).

        >>> from jianmu_fast.memory.context import PromptRuntimeContext
        >>> cat = SkillsCatalog([Skill("greet", "Say hello.")])
        >>> SkillsCatalog.resolve_runtime(PromptRuntimeContext(skills_catalog=cat)) is cat
        True
        """
        if runtime_prompt is not None:
            given = getattr(runtime_prompt, "skills_catalog", None)
            if given is not None:
                return given if isinstance(given, SkillsCatalog) else cls(as_skill_list(given))
            skills_dir = getattr(runtime_prompt, "skills_dir", None)
            if skills_dir is not None:
                return cls.from_dir(skills_dir)
        if config is None:
            from ..config.loader import load_config

            config = load_config()
        configured = config.paths.get("skills_dir")
        if configured:
            return cls.from_dir(configured)
        return cls.from_dir(Path.cwd() / DEFAULT_SKILLS_DIR, missing_ok=True)
