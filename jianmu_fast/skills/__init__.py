"""Skills: ``SKILL.md`` parsing, ``Skill`` and ``SkillsCatalog``.

>>> from jianmu_fast.skills import Skill, SkillsCatalog
>>> len(SkillsCatalog([Skill("greet", "Say hello.", "Be warm.")]))
1
"""

from .catalog import DEFAULT_SKILLS_DIR, SkillsCatalog, as_skill_list
from .skill import DEFAULT_MAX_SKILL_BYTES, SKILL_FILE, Skill, SkillType, load_skill, parse_skill_md

__all__ = [
    "Skill",
    "SkillType",
    "SkillsCatalog",
    "as_skill_list",
    "parse_skill_md",
    "load_skill",
    "SKILL_FILE",
    "DEFAULT_SKILLS_DIR",
    "DEFAULT_MAX_SKILL_BYTES",
]
