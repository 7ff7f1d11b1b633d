"""Token counts of a request's ``tools`` list (``count_tools``), per counter family.

OpenAI does not publish how it renders tools into the prompt (it is believed to be a
TypeScript-like ``namespace functions { ... }`` block). The tiktoken counters use the
formula of OpenAI's cookbook ("How to count tokens with tiktoken", section 7), which matches
the API on its worked example (105 tokens on gpt-4 / cl100k_base, 101 on gpt-4o /
o200k_base, reproduced in our tests), generalised to schemas the cookbook's code cannot read
(missing descriptions, nested objects): an approximation, exact on flat schemas.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

__all__ = ["iter_functions", "openai_tools_tokens", "json_tools_tokens"]


def iter_functions(tools_schema: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """``(where, function dict)`` for each tool; accepts the ``{"type": "function", "function":
    {...}}`` shape and bare function dicts. Bad input raises naming ``tools_schema[i]``."""
    if isinstance(tools_schema, (str, bytes, Mapping)) or not isinstance(tools_schema, Sequence):
        raise TypeError(
            f"tools_schema: expected a list of tool dicts, got {type(tools_schema).__name__}"
        )
    out = []
    for i, tool in enumerate(tools_schema):
        where = f"tools_schema[{i}]"
        if not isinstance(tool, Mapping):
            raise TypeError(f"{where}: expected a tool dict, got {type(tool).__name__}")
        fn = tool.get("function") if "function" in tool else tool
        if "function" in tool:
            where += ".function"
        if not isinstance(fn, Mapping):
            raise TypeError(f"{where}: expected a dict with 'name' and 'parameters', got {type(fn).__name__}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}.name: a tool needs a non-empty string name, got {fn.get('name')!r}")
        out.append((where, fn))
    return out


def _strip_dot(text: Any) -> str:
    s = text if isinstance(text, str) else ("" if text is None else str(text))
    return s[:-1] if s.endswith(".") else s


def openai_tools_tokens(
    tools_schema: Sequence[Mapping[str, Any]],
    count_text: Callable[[str], int],
    func_init: int,
) -> int:
    """The cookbook formula::

        if tools: FUNC_END (12)
        per tool: func_init (7 for o200k_base, 10 otherwise) + tokens(f"{name}:{description}")
                  + (if it has properties) PROP_INIT (3)
                  + per property: PROP_KEY (3) + tokens(f"{key}:{type}:{description}")
                        + (if enum) -3 + per item: 3 + tokens(str(item))
                        + (our extension) tokens(compact JSON of the property's other keys)

    A trailing ``.`` of a description is dropped, as the cookbook does.
    """
    fns = iter_functions(tools_schema)
    if not fns:
        return 0
    total = 12
    for where, fn in fns:
        total += func_init + count_text(f"{fn['name']}:{_strip_dot(fn.get('description'))}")
        params = fn.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise TypeError(f"{where}.parameters: expected a JSON-schema dict, got {type(params).__name__}")
        props = params.get("properties") or {}
        if not isinstance(props, Mapping):
            raise TypeError(f"{where}.parameters.properties: expected a dict, got {type(props).__name__}")
        if props:
            total += 3
            for key, prop in props.items():
                if not isinstance(prop, Mapping):
                    raise TypeError(
                        f"{where}.parameters.properties.{key}: expected a dict, got {type(prop).__name__}"
                    )
                total += 3
                enum = prop.get("enum")
                if enum:
                    total -= 3
                    for item in enum:
                        total += 3 + count_text(item if isinstance(item, str) else json.dumps(item))
                ptype = prop.get("type", "")
                if not isinstance(ptype, str):
                    ptype = "|".join(map(str, ptype)) if isinstance(ptype, list) else str(ptype)
                total += count_text(f"{key}:{ptype}:{_strip_dot(prop.get('description'))}")
                rest = {k: v for k, v in prop.items() if k not in ("type", "description", "enum")}
                if rest:
                    total += count_text(json.dumps(rest, separators=(",", ":"), sort_keys=True, ensure_ascii=False))
    return total


def json_tools_tokens(
    tools_schema: Sequence[Mapping[str, Any]], count_text: Callable[[str], int], per_tool: int
) -> int:
    """``sum(per_tool + tokens(json.dumps(tool, ensure_ascii=False)))``: how chat templates
    (transformers' ``tojson``) write each tool into the prompt."""
    iter_functions(tools_schema)
    return sum(per_tool + count_text(json.dumps(t, ensure_ascii=False)) for t in tools_schema)
