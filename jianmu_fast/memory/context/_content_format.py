"""How a message's ``content`` reaches a chat template: ``ChatTemplateTokenCounter(content_format=...)``.

transformers passes ``content`` as the caller gives it (``content_format=None``, the default):
a string, or a list of content blocks the template may or may not read. vLLM's OpenAI server
(and SGLang, which follows it) normalizes it first, by the template's *content format*
(``--chat-template-content-format``):

- ``"string"``: the text blocks' texts (``text``, ``input_text``, ``output_text``; a
  ``refusal`` block's ``refusal``, a ``thinking`` block's ``thinking``), empty ones left out,
  joined by ``"\\n"``; no content is ``""``.
- ``"openai"``: a list of ``{"type": "text", "text": ...}`` blocks -- a string content is one
  such block, no content is ``[]``.
- ``"auto"``: ``"openai"`` for a template that loops over a message's ``content`` (Llama 3.1,
  Llama 4, Mistral Small 3.1...), else ``"string"`` (Qwen3, Hermes, gpt-oss, DeepSeek-V3),
  decided from the template's syntax tree as vLLM decides it (a template that does not parse,
  or whose loops cannot be followed, is ``"string"``); a model's "tool_use" template decides
  for the requests with tools.

Media blocks (images, audio, video) become model-specific placeholders there, whose cost the
server knows only from the media: under ``"string"`` or ``"openai"`` such a block is a
``MessageValidationError`` (this counter counts text).

>>> content_format_of("{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}")
'openai'
>>> content_format_of("{% for m in messages %}{{ m.content }}{% endfor %}")
'string'
>>> string_content([{"type": "text", "text": "a"}, {"type": "text", "text": ""}, {"type": "refusal", "refusal": "b"}], "m")
'a\\nb'
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ...errors import MessageValidationError

__all__ = ["CONTENT_FORMATS", "check_content_format", "content_format_of", "openai_content", "string_content"]

#: what ``content_format`` accepts (None: as transformers, the content as given)
CONTENT_FORMATS = (None, "string", "openai", "auto")
#: text-like block types and the key that holds their text (vLLM's parser map)
_TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
#: media block types (a server turns them into placeholders whose cost depends on the media)
_MEDIA = frozenset({"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio",
                    "audio_embeds", "video_url"})


def check_content_format(value: Any) -> Optional[str]:
    """``value`` if it is one of ``CONTENT_FORMATS``, else ``ValueError`` naming them."""
    if value is not None and (not isinstance(value, str) or value not in CONTENT_FORMATS):
        raise ValueError(f"content_format must be None, 'string', 'openai' or 'auto', got {value!r}")
    return value  # type: ignore[no-any-return]


def _texts(content: list, fmt: str, where: str) -> Iterator[tuple[str, Any]]:
    """``(type, text)`` of each block of ``content``; media and unknown blocks are errors."""
    for j, block in enumerate(content):
        btype = block.get("type")
        key = _TEXT_KEYS.get(btype)
        if key is None:
            what = "a media block" if btype in _MEDIA else "a block of a type vLLM does not know"
            raise MessageValidationError(
                f"{where}.content[{j}]: {what} ({btype!r}); with content_format={fmt!r} "
                "ChatTemplateTokenCounter counts text blocks only (text, input_text, output_text, "
                "refusal, thinking)"
            )
        text = block.get(key)
        if text is not None and not isinstance(text, str):
            raise MessageValidationError(
                f"{where}.content[{j}]: a {btype!r} block whose {key!r} is {type(text).__name__}, not a string"
            )
        yield btype, text


def string_content(content: Any, where: str) -> str:
    """The content vLLM gives a ``"string"``-format template: text blocks' non-empty texts
    joined by ``"\\n"``, ``""`` for none; a string as it is."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join([t for _, t in _texts(content, "string", where) if t])


def openai_content(content: Any, where: str) -> list:
    """The content vLLM gives an ``"openai"``-format template: ``{"type": "text", "text": t}``
    per text block (a ``text`` or ``refusal`` block without its text left out), a string as
    one such block, ``[]`` for none."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": t} for b, t in _texts(content, "openai", where)
            if t is not None or b not in ("text", "refusal")]


def content_format_of(template: str) -> str:
    """``"openai"`` when ``template`` loops over a message's ``content`` (a ``for`` over
    ``m.content`` or ``m['content']``, filtered, tested or sliced, where ``m`` is a loop
    variable over ``messages`` or a variable set from it), else ``"string"``; ``"string"``
    too for a template that does not parse or binds those names in forms not followed
    (vLLM's rule and its default)."""
    try:
        from .chat_template import _compile  # (its environment: transformers' settings and tags)

        root = _compile("").environment.parse(template)
        return "openai" if _loops_over_content(root) else "string"
    except Exception:  # (vLLM's outcome for a template it cannot analyse)
        return "string"


def _reads(node: Any, name: str, key: Optional[str] = None) -> bool:
    """``node`` is the variable ``name`` (its ``key`` item or attribute, with ``key``), maybe
    through filters, tests or a slice."""
    import jinja2.nodes as nodes

    while True:
        if isinstance(node, (nodes.Filter, nodes.Test)):
            if node.node is None:
                return False
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            break
    if key is not None:
        if isinstance(node, nodes.Getitem):
            if not (isinstance(node.arg, nodes.Const) and node.arg.value == key):
                return False
        elif isinstance(node, nodes.Getattr):
            if node.attr != key:
                return False
        else:
            return False
        node = node.node
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _target_name(node: Any) -> str:
    import jinja2.nodes as nodes

    if not isinstance(node, nodes.Name):
        raise TypeError("a binding that is not a plain name")  # (vLLM: the default format)
    return node.name  # type: ignore[no-any-return]


def _loops_over_content(root: Any) -> bool:
    import jinja2.nodes as nodes

    # names bound to `messages` or its elements' slices: `messages` and, transitively, `set`s from them
    names = ["messages"]
    seen = {"messages"}
    at = 0
    while at < len(names):
        current = names[at]
        at += 1
        for assign in root.find_all(nodes.Assign):
            if _reads(assign.node, current):
                name = _target_name(assign.target)
                if name not in seen:
                    seen.add(name)
                    names.append(name)
    loops = list(root.find_all(nodes.For))
    messages = [_target_name(loop.target) for loop in loops if any(_reads(loop.iter, n) for n in names)]
    for loop in loops:
        if any(_reads(loop.iter, m, "content") for m in messages):
            _target_name(loop.target)
            return True
    return False
