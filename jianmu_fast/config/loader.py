"""Find, parse, check and cache ``jianmu.yaml``.

Which file: ``$JIANMU_CONFIG`` when it is set (the file must then exist), else
``jianmu.yaml`` in the current working directory at the time of the call (absent: the
empty configuration, every default applies). The file is read at first use, never at import
time, and cached per ``(path, mtime_ns, size)``: editing it takes effect at the next call.

The file holds three sections, each optional::

    prompt:                       # texts of jianmu_fast.config.prompts (see PROMPT_FIELDS)
      persona_default_prompt: "You are a terse assistant."
      bootstrap_files: [AGENTS.md, docs/CONVENTIONS.md]
    paths:                        # relative paths resolve against the file's own directory
      skills_dir: skills
      workspace_dir: .
    constraints:
      max_messages: 40            # a positive int, read by Constraints
      tool_result_max_tokens: 2000  # optional: presets cap tool results (ToolResultCapFilter)
      clear_tool_results: 3         # optional: presets clear all but the 3 newest (ClearToolResultsFilter)

Errors are :class:`~jianmu_fast.errors.ConfigError` (never swallowed by the builder's error
isolation) naming the file, the line where known, and the key: malformed YAML, a section that
is not a mapping, a value of the wrong type. A key the loader does not know is a
:class:`JianmuConfigWarning` naming the key and the file, and is otherwise ignored.

>>> cfg = load_config()            # the repository has no jianmu.yaml
>>> cfg.path is None, dict(cfg.prompt), dict(cfg.paths)
(True, {}, {})
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional

from ..errors import ConfigError
from .prompts import PROMPT_FIELDS

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "safe_yaml_compose",
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_NAME",
    "JianmuConfig",
    "JianmuConfigWarning",
    "config_path",
    "load_config",
    "reload_config",
    "clear_config_cache",
]

CONFIG_ENV_VAR = "JIANMU_CONFIG"
DEFAULT_CONFIG_NAME = "jianmu.yaml"

_SECTIONS = ("prompt", "paths", "constraints")
_PATH_KEYS = ("skills_dir", "workspace_dir")
_CONSTRAINT_KEYS = ("max_messages", "tool_result_max_tokens", "clear_tool_results")

_EMPTY: Mapping[str, Any] = MappingProxyType({})

#: the largest configuration file read (bytes)
MAX_CONFIG_BYTES = 1 << 20
#: deepest nesting of collections a YAML document may have (``jianmu.yaml``, ``SKILL.md``)
MAX_YAML_DEPTH = 64
#: most nodes a YAML document may have once every alias is expanded (stops "billion laughs")
MAX_YAML_NODES = 10_000


class JianmuConfigWarning(UserWarning):
    """``jianmu.yaml`` holds a key jianmu_fast does not know (a typo, most often)."""


@dataclass(frozen=True)
class JianmuConfig:
    """The checked content of one ``jianmu.yaml`` (read-only mappings).

    ``path`` is the file it came from (``None``: no file, the empty configuration).
    ``prompt`` maps field names of :data:`~jianmu_fast.config.prompts.PROMPT_FIELDS` to
    their values; ``paths`` holds absolute paths; ``constraints`` holds ``max_messages``.

    >>> JianmuConfig().paths.get("skills_dir") is None
    True
    """

    path: Optional[Path] = None
    prompt: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    paths: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    constraints: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


_lock = threading.Lock()
_cache: dict[tuple[str, int, int], JianmuConfig] = {}
#: bumped by every ``clear_config_cache()``: consumers that keep a resolved value between
#: calls (``StateHistoryProvider``'s semantics note) compare it to know they must look again
_generation = 0


def config_path() -> Optional[Path]:
    """The configuration file in effect now, or ``None`` when there is none.

    ``$JIANMU_CONFIG`` names a file that must exist (a ``ConfigError`` otherwise);
    ``./jianmu.yaml`` is used only when it exists.

    >>> config_path() is None or config_path().name == "jianmu.yaml"
    True
    """
    env = os.environ.get(CONFIG_ENV_VAR)
    if env:
        p = Path(env).expanduser().absolute()
        if not p.is_file():
            raise ConfigError(
                f"{CONFIG_ENV_VAR}={env!r}: no such file ({p}). Create it, or unset {CONFIG_ENV_VAR} "
                f"to use ./{DEFAULT_CONFIG_NAME}."
            )
        return p
    p = Path.cwd() / DEFAULT_CONFIG_NAME
    return p if p.is_file() else None


def load_config() -> JianmuConfig:
    """Parse the configuration file in effect (cached per path, mtime and size).

    >>> load_config() is load_config()
    True
    """
    if not os.environ.get(CONFIG_ENV_VAR):
        # the common case, called on every prompt: two system calls, no Path objects
        local = os.path.join(os.getcwd(), DEFAULT_CONFIG_NAME)
        try:
            st = os.stat(local)
        except OSError:
            return _NO_FILE
        if not stat.S_ISREG(st.st_mode):
            return _NO_FILE
        path = Path(local)
    else:
        found = config_path()
        assert found is not None  # $JIANMU_CONFIG names an existing file, or config_path raised
        path = found
        try:
            st = path.stat()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the configuration file: {exc}") from exc
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    cfg = _parse_file(path)
    with _lock:
        for old in [k for k in _cache if k[0] == key[0]]:
            del _cache[old]
        _cache[key] = cfg
    return cfg


def clear_config_cache() -> None:
    """Forget every parsed configuration (tests call this after rewriting a file in place).

    Consumers that keep a resolved text between calls (``StateHistoryProvider``'s semantics
    note, re-checked at most once a second) also look again at their next call.

    >>> clear_config_cache()
    """
    global _generation
    with _lock:
        _cache.clear()
        _generation += 1


def reload_config() -> JianmuConfig:
    """Clear the cache and parse the configuration file in effect again.

    >>> reload_config().path is None
    True
    """
    clear_config_cache()
    return load_config()


_NO_FILE = JianmuConfig()


# -- parsing ---------------------------------------------------------------------------------


_loader_cls: Any = None


def _bounded_loader() -> Any:
    """A ``yaml.SafeLoader`` subclass that bounds the document *while it is composed*:
    nesting deeper than :data:`MAX_YAML_DEPTH`, or more than :data:`MAX_YAML_NODES` nodes
    with every alias counted at the full size of what it names, raise ``ComposerError`` at
    the node's line, before anything is constructed (so an alias bomb costs microseconds,
    and deep nesting never reaches Python's recursion limit)."""
    global _loader_cls
    if _loader_cls is not None:
        return _loader_cls
    import yaml  # type: ignore[import-untyped]
    from yaml.composer import ComposerError  # type: ignore[import-untyped]
    from yaml.scanner import ScannerError  # type: ignore[import-untyped]

    class BoundedSafeLoader(yaml.SafeLoader):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._depth = 0
            self._sizes: dict[int, int] = {}

        def fetch_flow_collection_start(self, token_class: Any) -> None:
            # the scanner looks ahead over every open '[' / '{': stop deep flow nesting here,
            # before that look-ahead turns quadratic
            if self.flow_level >= MAX_YAML_DEPTH:
                raise ScannerError(
                    None, None, f"collections nested deeper than {MAX_YAML_DEPTH} levels", self.get_mark()
                )
            super().fetch_flow_collection_start(token_class)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self._depth >= MAX_YAML_DEPTH:
                raise ComposerError(
                    None, None, f"collections nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
                )
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            key = id(node)
            if key not in self._sizes and isinstance(node, yaml.CollectionNode):
                get = self._sizes.get
                if isinstance(node, yaml.MappingNode):
                    size = 1 + sum(get(id(k), 1) + get(id(v), 1) for k, v in node.value)
                else:
                    size = 1 + sum(get(id(v), 1) for v in node.value)
                if size > MAX_YAML_NODES:
                    raise ComposerError(
                        None, None,
                        f"the document expands to more than {MAX_YAML_NODES} values once its aliases "
                        "(*name) are expanded; an alias bomb? Write the values out, or use fewer aliases",
                        node.start_mark,
                    )
                self._sizes[key] = size
            return node

    _loader_cls = BoundedSafeLoader
    return _loader_cls


def safe_yaml_compose(text: str) -> tuple[Any, Any]:
    """``(root node, data)`` of one YAML document, composed once with the bounds above and
    constructed with the safe constructor. Raises ``yaml.YAMLError`` (with a mark).

    >>> safe_yaml_compose("a: [1, 2]")[1]
    {'a': [1, 2]}
    >>> lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + [
    ...     f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdefg", "bcdefgh")]
    >>> bomb = chr(10).join(lines)
    >>> try:
    ...     safe_yaml_compose(bomb)
    ... except Exception as exc:
    ...     print(exc.problem_mark.line + 1, exc.problem[:39])
    4 the document expands to more than 10000
    """
    loader = _bounded_loader()(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return root, data


def _short(value: Any) -> str:
    """A bounded ``repr`` of a configured value for error messages (never the whole value).

    >>> _short(["x" * 500])[-20:]
    "xxxxxxxxxxxxxxx...']"
    """
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxstring, r.maxother = 3, 6, 6, 6, 80, 80
    text = r.repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _key_lines(root: Any) -> dict[tuple[str, ...], int]:
    """1-based line of each key, by its path (``("prompt", "persona_default_prompt")``)."""
    import yaml  # type: ignore[import-untyped]
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...], depth: int) -> None:
        if depth > 2 or not isinstance(node, yaml.MappingNode):
            return
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                path = prefix + (str(k.value),)
                lines.setdefault(path, k.start_mark.line + 1)
                walk(v, path, depth + 1)

    walk(root, (), 1)
    return lines


class _Checker:
    def __init__(self, path: Path, lines: dict[tuple[str, ...], int]) -> None:
        self.path = path
        self.lines = lines

    def where(self, *keys: str) -> str:
        line = self.lines.get(tuple(keys))
        return f"{self.path}:{line}" if line else str(self.path)

    def fail(self, keys: tuple[str, ...], what: str) -> ConfigError:
        return ConfigError(f"{self.where(*keys)}: {'.'.join(keys)}: {what}")

    def unknown(self, keys: tuple[str, ...], known: tuple[str, ...] | list[str]) -> None:
        warnings.warn(
            f"{self.where(*keys)}: unknown key {'.'.join(keys)!r} is ignored; known keys here: "
            f"{', '.join(known)}",
            JianmuConfigWarning,
            stacklevel=4,
        )

    def section(self, data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
        value = data.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail((name,), f"expected a mapping of keys to values, got {type(value).__name__}")
        return value


def _parse_file(path: Path) -> JianmuConfig:
    import yaml  # type: ignore[import-untyped]  # lazy: importing jianmu_fast does not load pyyaml

    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = b"" if size > MAX_CONFIG_BYTES else fh.read(MAX_CONFIG_BYTES + 1)
        if size > MAX_CONFIG_BYTES or len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: the configuration file is {max(size, len(data))} bytes, over the "
                f"{MAX_CONFIG_BYTES}-byte limit; is it the right file?"
            )
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 at byte {exc.start}; save the file as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc}") from exc
    try:
        root, data = safe_yaml_compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: malformed YAML: {problem}. Fix the file, or point {CONFIG_ENV_VAR} elsewhere.") from exc
    chk = _Checker(path, _key_lines(root))
    if data is None:
        return JianmuConfig(path=path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping with the sections {', '.join(_SECTIONS)}; "
            f"got {type(data).__name__}"
        )
    for key in data:
        if key not in _SECTIONS:
            chk.unknown((str(key),), _SECTIONS)
    return JianmuConfig(
        path=path,
        prompt=MappingProxyType(_check_prompt(chk, chk.section(data, "prompt"))),
        paths=MappingProxyType(_check_paths(chk, chk.section(data, "paths"))),
        constraints=MappingProxyType(_check_constraints(chk, chk.section(data, "constraints"))),
    )


def _check_prompt(chk: _Checker, section: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in section.items():
        keys = ("prompt", str(key))
        if key not in PROMPT_FIELDS:
            chk.unknown(keys, list(PROMPT_FIELDS))
            continue
        if value is None:
            continue
        if PROMPT_FIELDS[key] is list:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise chk.fail(keys, f"expected a list of file names (non-empty strings), got {_short(value)}")
            out[key] = tuple(value)
            continue
        if not isinstance(value, str):
            raise chk.fail(keys, f"expected a string, got {type(value).__name__} ({_short(value)}); quote it")
        if key == "tools_prompt_template" and "{tools_desc}" not in value:
            raise chk.fail(keys, "the template must contain '{tools_desc}', where the tool list goes")
        out[key] = value
    return out


def _check_paths(chk: _Checker, section: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in section.items():
        keys = ("paths", str(key))
        if key not in _PATH_KEYS:
            chk.unknown(keys, _PATH_KEYS)
            continue
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise chk.fail(keys, f"expected a directory path (a non-empty string), got {_short(value)}")
        p = Path(value).expanduser()
        out[key] = str(p if p.is_absolute() else (chk.path.parent / p).absolute())
    return out


def _check_constraints(chk: _Checker, section: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in section.items():
        keys = ("constraints", str(key))
        if key not in _CONSTRAINT_KEYS:
            chk.unknown(keys, _CONSTRAINT_KEYS)
            continue
        if value is None:
            continue
        if key == "clear_tool_results":  # ClearToolResultsFilter's keep: 0 clears every old result
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise chk.fail(keys, f"expected an integer >= 0 (the tool results kept), got {_short(value)}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise chk.fail(keys, f"expected a positive integer, got {_short(value)}")
        out[key] = value
    return out
