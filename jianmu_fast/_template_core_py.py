"""The hot path of ``ChatTemplateTokenCounter`` (pure-Python twin of ``csrc/_template_core.pyx``).

What a hot-loop turn runs for its new messages: each message's template dict, key and frame
part (``entry``; ``call_entry`` for a tool-call message in one pass), its unit's costs from a
unit plan (``prefill_units``, ``plan``, ``plan_texts``, ``piece_counts``) and the prompt's count
from cached unit costs (``count_messages``, ``segments``). The functions taking ``self`` are
``ChatTemplateTokenCounter``'s methods (the class binds them from ``jianmu_fast._backend``);
see ``jianmu_fast.memory.context.chat_template`` for what they compute and why it is exact.
The compiled module is this very source (``include``d by ``csrc/_template_core.pyx``), so the
two differ only in speed; a hypothesis test holds their counts equal.
"""

import bisect
import copy
import itertools
import json
import re
import weakref
from typing import Any, Iterable, Mapping, Optional, Sequence

try:  # (the compiled build: Cython's decorators, ``ccall``: C calls between its functions)
    import cython  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pure Python without Cython installed (a build dependency only): no-ops
    class cython:  # type: ignore[no-redef]
        @staticmethod
        def ccall(f: Any) -> Any:
            return f

        cclass = ccall

        @staticmethod
        def auto_pickle(on: bool) -> Any:
            return lambda c: c

        @staticmethod
        def declare(*args: Any, **kwargs: Any) -> Any:
            return None

        compiled = False

from .errors import MessageValidationError
from ._template_base import _DERIVATIONS, _ENCODE_PARSED, DERIVED, NOT_YET, Refused, derivation_id, dumps_parsed, freeze, json_inside
from .message import Message
from .message.model import FrozenDict, FrozenList, coerce_message, thaw

__all__ = [
    "CounterCore", "any_lookahead", "bisect_ints", "costs_sum", "any_orphan", "any_whole", "carried_last", "looks_in", "holds_kept", "last_user", "plain_query", "any_system", "args_text", "block_entry", "call_entries", "call_entry", "count_list", "count_messages", "encode_lengths", "end_cost",
    "entries_stable",
    "entry", "flat_printed", "frame_part", "head_groups", "holds_token", "is_local", "json_escaped", "json_snapshot", "json_unchanged", "keep_last", "last_final", "local_pattern", "message_to_template_dict", "message_key", "new_starts", "overlap",
    "ops_hold", "parse_key", "slot_value", "derivation_id", "DERIVED", "piece_counts", "plain_entry", "plain_frame", "plan", "plan_groups", "plan_texts", "planned_cost", "planned_costs",
    "prefill_planned", "prefill_units", "put_str", "put_untracked", "reasoning_entry", "recall", "repeats_of_last", "role_of", "run_text", "run_text_of",
    "same_json", "segments", "settle", "settle_entry", "shed_keys", "holds_message_key", "shared_run", "step_costs", "store_all", "token_searches", "turn_list", "role_positions", "tools_signature", "trait", "trait_value", "unit_locality", "unit_parts", "unit_preds", "unit_starts", "unit_succ", "unit_total", "upper_costs", "user_repeats",
]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: ``json.dumps(x, ensure_ascii=False)`` without building an encoder per call
_DUMPS = json.JSONEncoder(ensure_ascii=False).encode
_ENC_STR = json.encoder.encode_basestring  # (ensure_ascii off: the C encoder where available)
_REF = weakref.ref
_BISECT_LEFT = bisect.bisect_left
_BISECT_RIGHT = bisect.bisect_right
#: a position no message reaches (``segments``: no user message, no unit kept)
_NEVER = 1 << 62
#: message traits (``trait``'s), one object per distinct value: a counter keeps one per message
#: key, and an eval run's messages have a handful of traits between them (no two new tuples a
#: message for the garbage collector to count and walk); bounded, past it each is its own
_TRAITS: dict = {}
_ISLICE = itertools.islice
_PLAIN_KEYS = frozenset(("role", "content", "name", "tool_call_id"))
#: ``json.loads``' scanner (its default decoder's: the C one where available), called directly
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

try:  # the compiled build defines it before including this source (csrc/_template_core.pyx)
    json_escaped = _json_escaped_compiled  # type: ignore[name-defined]  # noqa: F821
except NameError:
    def json_escaped(v: str) -> str:
        """What ``tojson`` prints for the string ``v`` without its quotes
        (``json.dumps(v, ensure_ascii=False)[1:-1]``): a run's escaped tool output. Compiled,
        two passes over the string's code units: about half the C encoder's time on a coding
        agent's tool output (a 13 kB one: 13 us, not 26).

        >>> print(json_escaped('a "b"' + chr(10)))
        a \\"b\\"\\n
        """
        return _ENC_STR(v)[1:-1]  # type: ignore[no-any-return]


@cython.ccall
def settle(o: Any) -> Any:
    """``o``, which the counter keeps as long as its caches do: in the compiled build its
    containers made only of JSON values (tuples, lists and dicts of strings, numbers,
    booleans and None; a subclass is left alone) are no longer tracked by the cyclic
    garbage collector, which cannot find a cycle in them (CPython stops tracking such
    tuples itself, one nesting level per collection of their generation: a frame part's
    shape reached the oldest generation still tracked, and such survivors are what bring
    on the full collections). Nothing to do here: the garbage collector's bookkeeping
    only, no value changes.

    >>> settle(("a", (1, None)))
    ('a', (1, None))
    """
    if cython.compiled:  # (csrc/_template_core.pyx defines it before including this source)
        _json_untracked(o)  # type: ignore[name-defined]  # noqa: F821
    return o


@cython.ccall
def settle_entry(e: tuple) -> tuple:
    """``e``, a memo entry ``(weak reference, snapshot, template dict, key)``: in the
    compiled build its weak reference (one without a callback holds nothing strongly, so
    no cycle runs through it; the collector finds weak references through their
    referents, not by tracking them) and, where its other fields are untracked already
    (strings, and a template dict ``settle`` or CPython untracked; the dict is not walked:
    it may share an unvalidated message's lists), the entry itself are no longer tracked
    by the cyclic garbage collector. Nothing to do here.

    >>> import weakref
    >>> class M: pass
    >>> m = M()
    >>> settle_entry((weakref.ref(m), None, {"role": "user"}, "k"))[0]() is m
    True
    """
    if cython.compiled:  # (as settle's)
        _settle_entry_untracked(e)  # type: ignore[name-defined]  # noqa: F821
    return e


@cython.ccall
def put_untracked(cache: dict, key: Any, value: Any) -> None:
    """``cache[key] = value``, for a ``value`` that ``settle`` left untracked (a template
    dict): in the compiled build a cache the cyclic garbage collector does not track stays
    untracked (CPython tracks a dict as soon as it holds a dict, whatever that holds), so
    that a full collection does not walk it -- the counter's caches of an eval run hold
    tens of thousands of entries, and walking them (a cache miss an entry) made each full
    collection ~50 ms. Nothing else to do here.

    >>> c = {}; put_untracked(c, "k", {"role": "user"}); c
    {'k': {'role': 'user'}}
    """
    if cython.compiled:
        _put_untracked(cache, key, value)  # type: ignore[name-defined]  # noqa: F821
        return
    cache[key] = value


@cython.ccall
def _weak_ref(m: Any) -> Any:
    """``weakref.ref(m)``: compiled, made by ``PyWeakref_NewRef`` (not a call of the type)."""
    if cython.compiled:
        return PyWeakref_NewRef(m, None)  # type: ignore[name-defined]  # noqa: F821
    return _REF(m)


@cython.ccall
def _dict_get(d: Any, k: Any) -> Any:
    """``dict.get(d, k)`` for a dict or a subclass that reads as one (``FrozenDict``, a
    validated tool call): compiled, the C-level look-up (no ``get`` method call).

    >>> _dict_get(FrozenDict({"id": "c1"}), "id"), _dict_get({}, "id")
    ('c1', None)
    """
    if cython.compiled:
        return _dict_get_compiled(d, k)  # type: ignore[name-defined]  # noqa: F821
    return dict.get(d, k)


@cython.ccall
def _keys_are(d: Any, keys: tuple) -> bool:
    """``tuple(d) == keys`` (the dict ``d``'s keys, in this order) for a dict or a subclass
    that iterates as one: compiled, compared in place (no new tuple).

    >>> _keys_are({"id": 1, "type": 2}, ("id", "type")), _keys_are({"type": 2, "id": 1}, ("id", "type"))
    (True, False)
    """
    if cython.compiled:
        return _dict_keys_are(d, keys)  # type: ignore[name-defined]  # noqa: F821
    return tuple(d) == keys


@cython.ccall
def _instance_dict(m: Any) -> dict:
    """``m.__dict__`` (a ``Message``'s fields): compiled, read by ``PyObject_GenericGetDict``,
    past pydantic's ``__getattr__`` hook on the class (which every attribute read goes
    through first)."""
    if cython.compiled:
        return PyObject_GenericGetDict(m, cython.NULL)  # type: ignore[name-defined]  # noqa: F821
    return m.__dict__  # type: ignore[no-any-return]


@cython.ccall
def costs_sum(costs: Any) -> Any:
    """``sum(costs)`` of a unit's per-message costs (the unit caches' tuples of ints): compiled,
    added in a loop over the tuple, not by a call of the builtin (~300 instructions a call,
    three calls a turn in ``segments``).

    >>> costs_sum((3, 4)), costs_sum([5])
    (7, 5)
    """
    if type(costs) is not tuple:
        return sum(costs)
    t: tuple = costs
    total = 0
    for c in t:
        total += c
    return total


@cython.ccall
def bisect_ints(a: list, x: Any, right: bool = False) -> int:
    """``bisect.bisect_left(a, x)`` (``right``: ``bisect_right``) for a sorted list of ints (the
    unit starts ``segments`` searches): compiled, a loop in C, not a call of the module's
    function.

    >>> bisect_ints([0, 2, 5], 2), bisect_ints([0, 2, 5], 2, True), bisect_ints([], 1)
    (1, 2, 0)
    """
    if not cython.compiled:
        return _BISECT_RIGHT(a, x) if right else _BISECT_LEFT(a, x)
    lo: cython.Py_ssize_t = 0
    hi: cython.Py_ssize_t = len(a)
    mid: cython.Py_ssize_t
    while lo < hi:
        mid = (lo + hi) // 2
        if (not x < a[mid]) if right else a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cython.auto_pickle(False)  # (the counter pickles by its model folder: its own __getstate__)
@cython.cclass
class CounterCore:
    """The state of ``ChatTemplateTokenCounter`` that the functions below read on every turn --
    its caches, flags and the previous call's segments --, as fields of its base class (the
    counter derives from its build's ``CounterCore``; its ``__init__`` sets every field, and
    documents each). Compiled, the functions taking ``self: CounterCore`` read a field at a
    fixed offset, not by a look-up of its name in the instance and its class (~80 reads a turn,
    ~150 instructions each); assigning a ``dict`` field anything but a dict (or None) raises
    ``TypeError``. In the twin this is a plain class (each field None until the counter sets it).
    """

    cache_size = cython.declare(object, visibility="public")
    additive = cython.declare(object, visibility="public")
    _memo = cython.declare(dict, visibility="public")
    _by_key = cython.declare(dict, visibility="public")
    _key_chars = cython.declare(object, visibility="public")
    _max_key_chars = cython.declare(object, visibility="public")
    _calls = cython.declare(dict, visibility="public")
    _looks = cython.declare(dict, visibility="public")
    _frame_parts = cython.declare(dict, visibility="public")
    _units = cython.declare(dict, visibility="public")
    _local_units = cython.declare(dict, visibility="public")
    _local = cython.declare(dict, visibility="public")
    _plans = cython.declare(dict, visibility="public")
    _texts = cython.declare(dict, visibility="public")
    _pieces = cython.declare(dict, visibility="public")
    _long_pieces = cython.declare(dict, visibility="public")
    _run_texts = cython.declare(dict, visibility="public")
    _ends = cython.declare(dict, visibility="public")
    _frames = cython.declare(object, visibility="public")
    _sensitive = cython.declare(object, visibility="public")
    _last = cython.declare(object, visibility="public")
    _last_ms = cython.declare(object, visibility="public")
    _role_pos = cython.declare(object, visibility="public")
    _succ_blind = cython.declare(object, visibility="public")
    _final_rule = cython.declare(object, visibility="public")
    _query_rule = cython.declare(object, visibility="public")
    _final_reasoning = cython.declare(object, visibility="public")
    _real_system_pred = cython.declare(object, visibility="public")
    _plan_ok = cython.declare(object, visibility="public")
    _content_format = cython.declare(object, visibility="public")
    _token_head_groups = cython.declare(object, visibility="public")
    _token_firsts = cython.declare(object, visibility="public")
    _token_searches = cython.declare(tuple, visibility="public")
    _search = cython.declare(object, visibility="public")
    _lock = cython.declare(object, visibility="public")
    _fast = cython.declare(object, visibility="public")
    _empty = cython.declare(object, visibility="public")


@cython.ccall
def _parse_arguments(args: Any) -> Any:
    """``json.loads(args)`` for a str (``args`` itself if it is not JSON), else ``args``.

    The usual arguments (JSON text without surrounding whitespace) are scanned directly, as
    ``json.loads`` scans them (its decoder's ``scan_once`` at 0, the whole text consumed);
    anything else goes through ``json.loads`` itself, so every outcome is its own.

    >>> _parse_arguments('{"x": [1, 2.5]}'), _parse_arguments(' {"x": 1} '), _parse_arguments("{x")
    ({'x': [1, 2.5]}, {'x': 1}, '{x')
    """
    if isinstance(args, str):
        try:
            got = _SCAN(args, 0)
        except Exception:  # (json.loads below gives the outcome: its value or its error)
            got = None
        if got is not None and got[1] == len(args):
            return got[0]
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def message_to_template_dict(m: Message) -> dict[str, Any]:
    """The dict a chat template receives for ``m``, as transformers users and vLLM pass it.

    >>> from jianmu_fast.message import ai
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    >>> message_to_template_dict(ai(None, tool_calls=call))
    {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'c1', 'type': 'function', 'function': {'name': 'f', 'arguments': {'x': 1}}}]}
    """
    content = m.content
    if type(content) is str and m.tool_calls is None and not m.extra:  # a plain text message
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        return d
    d = {"role": m.role}
    if content is None and m.tool_calls:
        content = ""
    if content is not None:
        d["content"] = thaw(content) if isinstance(content, list) else content  # (plain lists and dicts)
    if m.name is not None:
        d["name"] = m.name
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.tool_calls is not None:
        calls = []
        for call in m.tool_calls:
            c = {k: v for k, v in call.items() if v is not None and k != "function"}
            fn = call.get("function")
            if isinstance(fn, Mapping):
                f = {k: v for k, v in fn.items() if v is not None}
                if "arguments" in f:
                    f["arguments"] = _parse_arguments(f["arguments"])
                c["function"] = f
            calls.append(c)
        d["tool_calls"] = calls
    for k, v in m.extra.items():
        if v is not None and k not in d:
            d[k] = copy.deepcopy(v)
    reasoning = next((d[k] for k in _REASONING_FIELDS if d.get(k) is not None), None)
    if reasoning is not None:  # transformers' _alias_reasoning_fields
        d = {"thinking": reasoning, **d, "reasoning_content": reasoning}
    return d


def message_key(d: Mapping[str, Any]) -> str:
    """A string naming the template dict ``d`` exactly (``_parse_key`` gives ``d`` back).

    A str ``content`` is kept out of the JSON (escaping a 4 kB tool result costs ~10 us a
    message): the key is the JSON of ``d`` with ``content`` null, a NUL, then the content.
    JSON never holds a raw NUL, so the first one ends the JSON part, and a key without one is
    plain JSON (a dict without a str content; the stand-ins').

    >>> k = message_key({"role": "tool", "content": 'a "b"\\x00', "name": "f"})
    >>> k
    '{"role": "tool", "content": null, "name": "f"}\\x00a "b"\\x00'
    >>> parse_key(k)
    {'role': 'tool', 'content': 'a "b"\\x00', 'name': 'f'}
    """
    content = d.get("content")
    if type(content) is not str:
        return _DUMPS(d)
    head = _plain_head(d)
    if head is None:
        head = _DUMPS({**d, "content": None})
    return head + "\0" + content


def _plain_head(d: Mapping[str, Any]) -> Optional[str]:
    """``_DUMPS({**d, "content": None})`` built directly for a dict of ``role``, ``content``
    and optional ``name``/``tool_call_id`` strings in that order (a tool result, a user or
    assistant text); None for any other dict."""
    if len(d) > 4 or not _PLAIN_KEYS.issuperset(d):
        return None
    it = iter(d)
    if next(it) != "role" or next(it) != "content" or type(d["role"]) is not str:
        return None
    out = '{"role": ' + _ENC_STR(d["role"]) + ', "content": null'
    for k in it:
        v = d[k]
        if type(v) is not str:
            return None
        out += ', "' + k + '": ' + _ENC_STR(v)
    return out + "}"


def parse_key(key: str) -> dict[str, Any]:
    """The template dict that ``_message_key`` named ``key`` (key order kept)."""
    head, sep, content = key.partition("\0")
    d: dict[str, Any] = json.loads(head)
    if sep:
        d["content"] = content
    return d


#: per role: its shape element in a frame part and its key's head (few roles: Message checks them)
_ROLE_PARTS: dict = {}


@cython.ccall
def _role_part(role: Any) -> tuple[Any, str, str, Any]:
    """``(("role", ("str", role)), '{"role": <role as JSON>, "content": null', ...)``, cached;
    then what ``plain_entry`` makes of a message of that role with text and no other field:
    its key's head (the key less the text) and its frame shape (one slot, the text)."""
    parts: dict = _ROLE_PARTS  # (typed: its get called directly, not looked up)
    rp = parts.get(role)
    if rp is None:
        role_shape = ("role", ("str", role))
        head = '{"role": ' + _ENC_STR(role) + ', "content": null'
        rp = (role_shape, head, head + "}\0", (role_shape, ("content", None)))
        if len(parts) < 64:
            parts[role] = rp
    return rp  # type: ignore[no-any-return]


@cython.ccall
def put_str(out: list, s: str) -> None:
    """Append ``_ENC_STR(s)`` (``s`` as a JSON string) to ``out``, in pieces: a short string
    with nothing to escape (no ``"``, backslash or control character: an id, a name) is put
    between quotes as it is, without a call to the encoder and a new string; any other goes
    through the encoder.

    >>> out = []
    >>> put_str(out, "call_1"); put_str(out, 'a"b'); "".join(out) == '"call_1""a\\\\"b"'
    True
    """
    ch: cython.Py_UCS4
    if len(s) <= 64:
        for ch in s:
            if ch == '"' or ch == "\\" or ch < " ":
                break
        else:
            out.append('"')
            out.append(s)
            out.append('"')
            return
    out.append(_ENC_STR(s))


@cython.ccall
def flat_printed(text: str) -> bool:
    """``_FLAT_PRINTED.fullmatch(text) is not None``, scanned character by character (no
    regular expression: a tool call's arguments are checked once per new message): ``{}`` or
    ``{"k": v, "k2": v2, ...}``, each key an escape-free string (no ``"``, backslash or control
    character inside), each value one too, or ``0``, ``-?[1-9][0-9]*``, ``true``, ``false``,
    ``null``, with ``": "`` and ``", "`` between them exactly.

    >>> flat_printed('{"city": "Paris", "n": -12, "ok": true}'), flat_printed('{"x":1}'), flat_printed("{}")
    (True, False, True)
    """
    n: cython.Py_ssize_t = len(text)
    i: cython.Py_ssize_t = 1
    ch: cython.Py_UCS4
    if n < 2 or text[0] != "{" or text[n - 1] != "}":
        return False
    if n == 2:
        return True
    while True:
        # a key: an escape-free string
        if i >= n or text[i] != '"':
            return False
        i += 1
        while True:
            if i >= n:
                return False
            ch = text[i]
            i += 1
            if ch == '"':
                break
            if ch == "\\" or ch < " ":
                return False
        if i + 1 >= n or text[i] != ":" or text[i + 1] != " ":
            return False
        i += 2
        if i >= n:
            return False
        ch = text[i]
        if ch == '"':  # an escape-free string
            i += 1
            while True:
                if i >= n:
                    return False
                ch = text[i]
                i += 1
                if ch == '"':
                    break
                if ch == "\\" or ch < " ":
                    return False
        elif ch == "0":
            i += 1
        elif ch == "-" or "1" <= ch <= "9":  # -?[1-9][0-9]*
            if ch == "-":
                i += 1
                if i >= n:
                    return False
                ch = text[i]
                if not "1" <= ch <= "9":
                    return False
            i += 1
            while i < n:
                ch = text[i]
                if not "0" <= ch <= "9":
                    break
                i += 1
        elif text.startswith("true", i) or text.startswith("null", i):
            i += 4
        elif text.startswith("false", i):
            i += 5
        else:
            return False
        if i == n - 1:  # (the closing brace, checked above)
            return True
        if i + 1 >= n or text[i] != "," or text[i + 1] != " ":
            return False
        i += 2


_J_STR = r'"[^"\\\x00-\x1f]*"'
_J_VALUE = "(?:" + _J_STR + r"|0|-?[1-9][0-9]*|true|false|null)"
#: a JSON object of string keys and values that are escape-free strings, integers (not -0),
#: true, false or null, printed as ``json.dumps`` prints it (no whitespace but ", " and ": "):
#: what ``flat_printed`` accepts, scanning (this expression is its specification: a property
#: test holds the two equal)
_FLAT_PRINTED = re.compile(r"\{(?:" + _J_STR + ": " + _J_VALUE + "(?:, " + _J_STR + ": " + _J_VALUE + r")*)?\}")


@cython.ccall
def args_text(text: str, args: dict[str, Any]) -> str:
    """``dumps_parsed(args)`` for ``args = json.loads(text)``: ``text`` itself when it is
    already printed that way (a flat object of escape-free strings, integers, true, false and
    null, with ``json.dumps``' separators and no key twice: its printing is its own text),
    else the encoder's output.

    >>> args_text('{"city": "Paris", "n": 2}', {"city": "Paris", "n": 2})
    '{"city": "Paris", "n": 2}'
    >>> args_text('{"x":1.50}', {"x": 1.5})
    '{"x": 1.5}'
    """
    if flat_printed(text) and text.count('": ') == len(args):
        return text
    if _ENCODE_PARSED is not None:  # (dumps_parsed, its C encoder called here)
        return "".join(_ENCODE_PARSED(args, 0))
    return dumps_parsed(args)


def _fields_of(m: Message) -> dict[str, Any]:
    """The fields ``plain_entry`` and ``call_entry`` read, by attribute (a ``Message``
    subclass; a ``Message`` itself is read from its ``__dict__``, where pydantic keeps them:
    one attribute lookup rather than one per field)."""
    return {"role": m.role, "content": m.content, "name": m.name, "tool_call_id": m.tool_call_id,
            "tool_calls": m.tool_calls, "extra": m.extra}


#: the usual tool call's keys (``{"id": ..., "type": "function", "function": {"name": ...,
#: "arguments": ...}}``, in this order) and its shape in a frame part (``call_entry``'s general
#: path builds the same for it: a non-empty id and name are slots, the arguments a tojson slot)
_STD_CALL_KEYS = ("id", "type", "function")
_STD_FN_KEYS = ("name", "arguments")
_STD_CALL_SHAPE = (("id", None), ("type", ("str", "function")),
                   ("function", ("F", (("name", None), ("arguments", ("A",))), None)))


@cython.ccall
def call_entry(m: Message, bare: bool = False) -> Optional[tuple[dict[str, Any], str, tuple[Any, tuple[str, ...]]]]:
    """``(message_to_template_dict(m), message_key(d), Frames().frame_of(d))`` in one pass
    for the usual tool-call message (calls with ``str`` ids, types and function names,
    ``arguments`` a string; no ``name``, ``tool_call_id`` or extra fields -- ``bare``: its
    extra fields left out): the arguments are parsed once and printed once, for the key and
    the frame's slot. None for any other message.

    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    >>> from jianmu_fast.message import ai
    >>> from jianmu_fast.memory.context._template_frames import Frames
    >>> d, key, part = call_entry(ai("On it.", tool_calls=call))
    >>> key == message_key(d) and part == Frames(lambda ds: "").frame_of(d)
    True
    >>> part[1]
    ('On it.', 'c1', 'f', '{"x": 1}')
    """
    mf: dict = _instance_dict(m) if type(m) is Message else _fields_of(m)
    tool_calls = mf["tool_calls"]
    if not tool_calls or (mf["extra"] and not bare) or mf["name"] is not None or mf["tool_call_id"] is not None:
        return None
    content = mf["content"]
    if content is None:
        content = ""
    elif type(content) is not str:
        return None
    role = mf["role"]
    rp = _role_part(role)
    calls: list = []
    out: list = [rp[1], ', "tool_calls": [']  # the key's text, joined once
    values: list = [content] if content else []
    cshapes: list = []
    for call in tool_calls:
        tc = type(call)
        if (tc is FrozenDict or tc is dict) and len(call) == 3:
            # the usual call: {"id": id, "type": "function", "function": {"name", "arguments"}}
            # (a validated message's FrozenDict, or a dict: read as dicts, in C)
            cid = _dict_get(call, "id")
            fn = _dict_get(call, "function")
            ctype = _dict_get(call, "type")
            tf = type(fn)
            if (type(cid) is str and cid and type(ctype) is str and ctype == "function"
                    and (tf is FrozenDict or tf is dict) and len(fn) == 2
                    and _keys_are(call, _STD_CALL_KEYS) and _keys_are(fn, _STD_FN_KEYS)):
                name = _dict_get(fn, "name")
                v = _dict_get(fn, "arguments")
                if type(name) is str and name and type(v) is str:
                    args = _parse_arguments(v)
                    if type(args) is not dict:
                        return None
                    text = args_text(v, args)
                    out.append('{"id": ' if not calls else ', {"id": ')
                    put_str(out, cid)
                    out.append(', "type": "function", "function": {"name": ')
                    put_str(out, name)
                    out.append(', "arguments": ')
                    out.append(text)
                    out.append("}}")
                    values.append(cid)
                    values.append(name)
                    values.append(text)
                    calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
                    cshapes.append(_STD_CALL_SHAPE)
                    continue
        c: dict = {}
        cshape: list = []
        fn = None
        out.append("{" if not calls else ", {")
        sep = ""
        for k, v in call.items():
            if k == "function":
                fn = v
            elif v is None:
                continue
            elif type(v) is not str or k not in ("id", "type"):
                return None
            else:
                c[k] = v
                out.append(sep + ('"id": ' if k == "id" else '"type": '))
                put_str(out, v)
                sep = ", "
                if k == "id" and v:
                    values.append(v)
                    cshape.append(("id", None))  # (a constant: compared by identity)
                else:
                    cshape.append((k, ("str", v)))
        if fn is None or not isinstance(fn, dict):
            return None
        f: dict = {}
        fshape: list = []
        out.append(sep + '"function": {')
        sep = ""
        for k, v in fn.items():
            if v is None:
                continue
            if type(v) is not str or k not in ("name", "arguments"):
                return None
            if k == "arguments":
                args = _parse_arguments(v)
                if type(args) is not dict:
                    return None
                f[k] = args
                text = args_text(v, args)
                out.append(sep + '"arguments": ')
                out.append(text)
                values.append(text)
                fshape.append(("arguments", ("A",)))
            else:
                f[k] = v
                out.append(sep + '"name": ')
                put_str(out, v)
                if v:
                    values.append(v)
                    fshape.append(("name", None))
                else:
                    fshape.append((k, ("str", v)))
            sep = ", "
        c["function"] = f
        out.append("}}")
        cshape.append(("function", ("F", tuple(fshape), None)))
        calls.append(c)
        cshapes.append(tuple(cshape))
    if not calls:
        return None
    d = {"role": role, "content": content, "tool_calls": calls}
    out.append("]}\0")
    out.append(content)
    key = "".join(out)
    shape = (rp[0], ("content", None) if content else ("content", ("str", "")),
             ("tool_calls", ("C", tuple(cshapes), None)))
    return d, key, (shape, tuple(values))


@cython.ccall
def _plain_fields(m: Message, content_type: type, bare: bool = False) -> Optional[tuple[Any, str, Optional[str], Optional[str]]]:
    """``(content, role, name, tool_call_id)`` of a message without tool calls or extra fields
    (``bare``: its extra fields left out) whose content is exactly of ``content_type`` and
    whose role, name and tool_call_id are strings (the last two or None); None for any other
    message."""
    mf: dict = _instance_dict(m) if type(m) is Message else _fields_of(m)
    content = mf["content"]
    if type(content) is not content_type or mf["tool_calls"] is not None or (mf["extra"] and not bare):
        return None
    role = mf["role"]
    name = mf["name"]
    tcid = mf["tool_call_id"]
    if type(role) is not str or (name is not None and type(name) is not str) or (
            tcid is not None and type(tcid) is not str):
        return None
    return content, role, name, tcid


@cython.ccall
def plain_entry(m: Message, fields: Sequence[str], bare: bool = False) -> Optional[tuple[dict[str, Any], str, tuple[Any, tuple[str, ...]]]]:
    """``(d, message_key(d), plain_frame(fields, d))`` for ``d = message_to_template_dict(m)``
    in one pass, for a plain text message (``str`` content, no tool calls, no extra fields --
    ``bare``: its extra fields left out --, ``name`` and ``tool_call_id`` strings or None);
    None for any other message.

    >>> from jianmu_fast.message import tool
    >>> m = tool("ok", tool_call_id="c1")
    >>> d, key, part = plain_entry(m, ("content", "name", "tool_call_id"))
    >>> d == message_to_template_dict(m) and key == message_key(d)
    True
    >>> part == plain_frame(("content", "name", "tool_call_id"), d)
    True
    """
    got = _plain_fields(m, str, bare)
    if got is None:
        return None
    content, role, name, tcid = got
    rp = _role_part(role)
    if name is None and tcid is None and content and "content" in fields:
        # (the usual user, assistant or system message: its key's head and its shape are its
        # role's, made once; the general path below builds the same)
        return {"role": role, "content": content}, rp[2] + content, (rp[3], (content,))
    d: dict = {"role": role, "content": content}
    head: list = [rp[1]]  # the key's text, joined once
    values: list = []
    shape: list = [rp[0]]
    if content and "content" in fields:
        values.append(content)
        shape.append(("content", None))
    else:
        shape.append(("content", ("str", content)))
    if name is not None:
        d["name"] = name
        head.append(', "name": ')
        put_str(head, name)
        if name and "name" in fields:
            values.append(name)
            shape.append(("name", None))
        else:
            shape.append(("name", ("str", name)))
    if tcid is not None:
        d["tool_call_id"] = tcid
        head.append(', "tool_call_id": ')
        put_str(head, tcid)
        if tcid and "tool_call_id" in fields:
            values.append(tcid)
            shape.append(("tool_call_id", None))
        else:
            shape.append(("tool_call_id", ("str", tcid)))
    head.append("}\0")
    head.append(content)
    return d, "".join(head), (tuple(shape), tuple(values))


def block_entry(m: Message, fields: Sequence[str]) -> Optional[tuple[dict[str, Any], str, tuple[Any, tuple[str, ...]]]]:
    """``(d, message_key(d), Frames().frame_of(d))`` for ``d = message_to_template_dict(m)`` in
    one pass, for a message whose content is a validated ``Message``'s frozen list of content
    blocks (passed as plain lists and dicts, as transformers users pass them: a template's
    error names their types), without tool calls or extra fields, ``name``
    and ``tool_call_id`` strings or None: each block's non-empty ``text`` a slot; None for any
    other message.

    >>> from jianmu_fast.message import human
    >>> from jianmu_fast.memory.context._template_frames import Frames
    >>> m = human([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}])
    >>> d, key, part = block_entry(m, ("content", "name", "tool_call_id"))
    >>> d == message_to_template_dict(m) and key == message_key(d) and part == Frames(lambda ds: "").frame_of(d)
    True
    >>> part[1]
    ('hi',)
    """
    got = _plain_fields(m, FrozenList)
    if got is None:
        return None
    content, role, name, tcid = got
    d: dict = {"role": role, "content": thaw(content)}
    values: list = []
    shape: list = [_role_part(role)[0]]
    if "content" in fields:
        blocks: list = []
        for b in content:
            if type(b) is not FrozenDict:
                return None
            bshape: list = []
            for bk, bv in b.items():
                if bk == "text" and type(bv) is str and bv:
                    values.append(bv)
                    bshape.append((bk, None))
                else:
                    bshape.append((bk, freeze(bv)))
            blocks.append(("b", tuple(bshape)))
        shape.append(("content", ("B", tuple(blocks))))
    else:
        shape.append(("content", freeze(content)))
    for k, v in (("name", name), ("tool_call_id", tcid)):
        if v is not None:
            d[k] = v
            if v and k in fields:
                values.append(v)
                shape.append((k, None))
            else:
                shape.append((k, ("str", v)))
    return d, message_key(d), (tuple(shape), tuple(values))


@cython.ccall
def reasoning_entry(got: tuple, field: str, r: str) -> tuple:
    """``(d, key, part)`` of an assistant message whose one extra field, ``field`` (one of
    ``_REASONING_FIELDS``), holds the reasoning ``r``, made from its bare one-pass entry ``got``
    (``call_entry``'s or ``plain_entry``'s with ``bare``): ``d`` as transformers aliases it
    (``thinking`` first, ``reasoning_content`` last, a ``reasoning`` field before it), its
    ``message_key`` and its frame part (``r`` a slot in each of them, or a constant where it is
    empty; see ``chat_template._FRAME_FIELDS``).

    >>> from jianmu_fast.message import ai
    >>> m = ai("Sunny.", extra={"reasoning": "hm"})
    >>> d, key, part = reasoning_entry(plain_entry(m, ("content",), True), "reasoning", "hm")
    >>> d == message_to_template_dict(m) and list(d) == list(message_to_template_dict(m)) and key == message_key(d)
    True
    >>> part[1]
    ('hm', 'Sunny.', 'hm', 'hm')
    """
    d0: dict = got[0]
    key0: str = got[1]
    shape0: tuple = got[2][0]
    values0: tuple = got[2][1]
    d: dict = {"thinking": r}
    d.update(d0)
    if field == "reasoning":
        d["reasoning"] = r
    d["reasoning_content"] = r
    h = key0.find("\0")  # (the JSON part ends on its "}": a one-pass entry's content is a str)
    e = _ENC_STR(r)
    mid = ', "reasoning": ' + e if field == "reasoning" else ""
    key = '{"thinking": ' + e + ", " + key0[1:h - 1] + mid + ', "reasoning_content": ' + e + "}" + key0[h:]
    if r:
        more = (("reasoning", None),) if field == "reasoning" else ()
        shape = (("thinking", None),) + shape0 + more + (("reasoning_content", None),)
        values = (r,) + values0 + ((r, r) if field == "reasoning" else (r,))
    else:
        c = ("str", r)
        more = (("reasoning", c),) if field == "reasoning" else ()
        shape = (("thinking", c),) + shape0 + more + (("reasoning_content", c),)
        values = values0
    return d, key, (shape, values)


@cython.ccall
def _only_reasoning(extra: dict) -> bool:
    """Whether every extra field is a reasoning field (``_REASONING_FIELDS``).

    >>> _only_reasoning({"reasoning_content": "hm", "thinking": None}), _only_reasoning({"refusal": "no"})
    (True, False)
    """
    for k in extra:
        if k not in _REASONING_FIELDS:
            return False
    return True


@cython.ccall
def _has_reasoning(d: Mapping[str, Any]) -> bool:
    for k in _REASONING_FIELDS:  # (a loop: no generator object per message)
        if d.get(k) is not None:
            return True
    return False


def _text_features(d: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(call_text, think_text)``: a tool-call message that carries text (gpt-oss shows it as
    analysis only while no final answer follows), an assistant text holding ``</think>``
    (Qwen3 reads it as reasoning, kept or stripped by where the last user query is)."""
    content = d.get("content")
    call_text = bool(content) and bool(d.get("tool_calls"))
    if d.get("role") != "assistant" or not content:
        return call_text, False
    if isinstance(content, str):
        return call_text, "</think>" in content
    texts = (b.get("text") for b in content if isinstance(b, Mapping)) if isinstance(content, list) else ()
    return call_text, any(isinstance(t, str) and "</think>" in t for t in texts)


@cython.ccall
def role_of(d: Mapping[str, Any]) -> Any:
    """A message's role as a unit's neighbour: "call" for an assistant message with calls
    (``ChatTemplateTokenCounter._role_of``).

    >>> role_of({"role": "assistant", "tool_calls": [{}]}), role_of({"role": "assistant", "tool_calls": []})
    ('call', 'assistant')
    """
    r = d["role"]
    return "call" if r == "assistant" and d.get("tool_calls") else r


@cython.ccall
def unit_preds(first_role: str, true_pred: Optional[str], opened: bool = False) -> list:
    """The neighbours a unit may have before it in a kept prompt (``ChatTemplateTokenCounter._preds``);
    ``opened``: the conversation opens with a system message every kept prompt keeps (none
    stands first).

    >>> unit_preds("assistant", "tool", True), unit_preds("tool", None), unit_preds("system", "first")
    (['tool', 'system'], ['call', 'tool'], ['first'])
    """
    if true_pred == "first":  # the conversation's first message stays first in a kept prompt
        return ["first"]
    base: list
    if true_pred is not None:
        if true_pred == "system":
            base = ["system"] if opened else ["system", "first"]
        else:
            base = [true_pred, "system"] if opened else [true_pred, "first", "system"]
    elif first_role == "tool":  # an orphan tool message, or a slice that starts inside a unit
        base = ["call", "tool"]
    else:
        base = ["first", "system", "user", "assistant", "tool"]
    if first_role == "system":  # its text may join an earlier system message's
        base.append("system_text")
    return base


@cython.ccall
def unit_starts(dicts: Sequence[Mapping[str, Any]]) -> list[int]:
    """Where the units of ``dicts`` start: the first message and every one but a tool result.

    >>> unit_starts([{"role": "tool"}, {"role": "assistant"}, {"role": "tool"}, {"role": "user"}])
    [0, 1, 3]
    """
    return [0] + new_starts(dicts, 1) if len(dicts) else []


def turn_list(self: CounterCore, msgs: Any, k: int, new: Sequence[Any], pinned: int) -> Any:
    """A budget filter's charges of a turn's new messages ``new`` (``TokenBudgetFilter``'s
    ``_template_counts`` and ``_slice_list`` in one call: the agent loop's turn): the counter's
    own ``_count_list`` (a subclass's override is asked too, as ``_slice_list`` asks it) of
    ``new`` with what their place in ``msgs`` (the filter's input, ``k`` messages recorded
    before them) tells -- ``start`` at ``k == 0``; ``pred``, the role of ``msgs[k - 1]``
    ("call" for an assistant message with calls; "any" where messages other than system ones
    are pinned: ``pinned`` 2); ``opened``, ``msgs`` opens with a system message and only system
    messages are pinned (``pinned`` 0; 1: none pinned). None where ``new`` is not that slice of
    ``msgs`` (records patched in place, items coerced to Messages: counted later by the filter);
    ``NOT_YET`` where ``new`` opens with tool results that continue the unit before them (the
    filter's own path: they are charged with that unit)."""
    if msgs is None or not new or len(msgs) - k != len(new) or msgs[k] is not new[0] or msgs[-1] is not new[-1]:
        return None
    m = new[0]
    if k and (_instance_dict(m)["role"] if type(m) is Message else m.role) == "tool":
        return NOT_YET
    pred: Optional[str] = None
    if pinned == 2:
        pred = "any"
    elif k:
        m = msgs[k - 1]
        if type(m) is Message:
            f: dict = _instance_dict(m)
            pred = "call" if f["role"] == "assistant" and f["tool_calls"] else f["role"]
    first = msgs[0]
    opened = pinned == 0 and type(first) is Message and _instance_dict(first)["role"] == "system"
    return self._count_list(new, k == 0, pred, opened)  # (the counter's own: a subclass may override it)


def count_list(self: CounterCore, messages: Sequence[Any], start: bool = True, pred: Optional[str] = None,
               opened: bool = False) -> list[int]:
    """``count_array(messages)`` as a list of ints (what ``TokenBudgetFilter`` takes for a
    turn's new messages). ``start``: ``messages[0]`` is the conversation's first message (a
    system message there is charged as the first, which it stays in any kept prompt); False
    for a turn's new messages and any other slice, whose first message may follow any other.
    ``pred``: where ``messages[0]`` follows others, the role of the message before it
    (``_role_of``'s: "call" for an assistant message with calls), when the caller knows it
    (the budget filter does): the unit is then charged the most over that neighbour and those
    a kept prompt may give it instead (none, the pinned system prompt), as a unit inside the
    list is; None: over every neighbour; "any": every unit over every neighbour (a kept prompt
    may put any unit after a pinned message of another role). Every unit is charged the most
    over every successor it may have, wherever it stands: a unit is charged the same in a
    turn's new messages as in a whole conversation. ``opened``: the conversation opens with a
    system message that every kept prompt keeps (the budget filter pins it), so no unit of
    ``messages`` (but that message itself, at ``start``) stands first in one: none is charged
    as a conversation's first."""
    ms = messages if isinstance(messages, (list, tuple)) else list(messages)
    out = [0] * len(ms)
    if not ms:
        return out
    keys, dicts, _ = entries_stable(self, ms)
    starts = unit_starts(dicts)
    n = len(ms)
    prefill_units(self, keys, dicts, starts)
    local_units: dict = self._local_units
    final = -2  # where the last final answer stands (last_final's), once a unit asks under _final_rule
    u: cython.Py_ssize_t
    for u in range(len(starts)):
        a = starts[u]
        b = starts[u + 1] if u + 1 < len(starts) else n
        first_role = dicts[a]["role"]
        known = local_units.get(tuple(keys[a:b])) if first_role != "tool" else None
        if known is not None:
            out[a:b] = known
            continue
        if a > 0:
            true_pred: Optional[str] = role_of(dicts[a - 1])
        elif first_role == "system" and start:
            true_pred = "first"
        elif first_role != "tool" and pred in ("system", "user", "assistant", "call", "tool"):
            true_pred = pred
        else:
            true_pred = None
        preds = unit_preds(first_role, None if pred == "any" and true_pred != "first" else true_pred, opened)
        true_succ = "end" if b == n else dicts[b]["role"]
        succs = ["user", "assistant", "system"]
        exact_pred = true_pred if true_pred is not None else ("tool" if first_role == "tool" else "user")
        caller = None
        if first_role == "tool" and true_pred is None:
            # a slice that starts inside a unit: stand the assistant that made the call before it
            exact_pred = "call"
            caller = self._calls.get(dicts[a].get("tool_call_id") or "")
        if self._final_rule and final == -2:
            final = last_final(dicts, 0, n)
        costs = upper_costs(self, tuple(keys[a:b]), dicts[a:b], preds, succs, (exact_pred, true_succ), caller,
                            final >= b)
        out[a:b] = costs
    return out


@cython.ccall
def prefill_units(self: CounterCore, keys: Sequence[str], dicts: Sequence[dict[str, Any]], starts: Sequence[int]) -> None:
    """Render every not-yet-costed neighbour-independent unit's prefixes, and count them
    all in one tokenizer batch (the turn's new units: one batch, not one per rendering)."""
    n = len(keys)
    convs: list[tuple[str, ...]] = []
    conv_dicts: list[list[dict[str, Any]]] = []
    # units to cost after the batch: (unit cache key, unit keys, not tool-first, first conversation)
    jobs: list[tuple[Any, tuple[str, ...], bool, int]] = []
    local_units: dict = self._local_units
    units: dict = self._units
    by_key: dict = self._by_key
    # units costed by their plan (see _plan): (unit cache key, not tool-first, steps, run texts)
    planned: list[tuple[Any, bool, Any, list[str]]] = []
    parts_of = self._frame_parts if self._RENDER_FREE and self._plan_ok else None
    u: cython.Py_ssize_t
    for u in range(len(starts)):
        a = starts[u]
        b = starts[u + 1] if u + 1 < len(starts) else n
        ukeys = tuple(keys[a:b])
        if ukeys in local_units:
            continue
        unit = dicts[a:b]
        if not unit_locality(self, ukeys, unit)[1]:
            continue
        first_role = unit[0]["role"]
        pred = "call" if first_role == "tool" else "first"  # _canonical
        uck = (ukeys, pred, "user", None)
        known = units.get(uck)
        if known is not None:
            if first_role != "tool":
                self._remember_local(ukeys, known)
            continue
        if parts_of is not None:
            parts = [parts_of.get(ukeys[j]) or frame_part(self, ukeys[j], unit[j]) for j in range(len(ukeys))]
            if parts[0][1]:  # (every prefix has a field value: a frame)
                try:
                    unit_plan = plan(self, pred, tuple([p[0] for p in parts]))
                except TypeError:  # a field value that cannot be a key (as Frames.render)
                    unit_plan = None
                if unit_plan is not None and unit_plan is not NOT_YET:
                    run_texts = plan_texts(self, unit_plan, [v for p in parts for v in p[1]])
                    if run_texts is not None:
                        planned.append((uck, first_role != "tool", unit_plan[2], run_texts))
                        continue
        pre, post = self._context(pred, "user")
        pre_d = [by_key.get(k) or parse_key(k) for k in pre]
        post_d = [by_key.get(k) or parse_key(k) for k in post]
        jobs.append((uck, ukeys, first_role != "tool", len(convs)))
        convs.append(pre + post)
        conv_dicts.append(pre_d + post_d)
        for j in range(1, b - a + 1):
            convs.append(pre + ukeys[:j] + post)
            conv_dicts.append(pre_d + list(unit[:j]) + post_d)
    if not jobs and not planned:
        return
    found: dict[Any, tuple[int, ...]] = {}
    found_local: dict[tuple[str, ...], tuple[int, ...]] = {}
    if planned:
        counts_of = piece_counts(self, [t for p in planned for t in p[3]])
        at_run = 0
        for uck, not_tool_first, steps, run_texts in planned:
            costs = tuple(step_costs(steps, counts_of[at_run:at_run + len(run_texts)]))
            at_run += len(run_texts)
            found[uck] = costs
            if not_tool_first:
                found_local[uck[0]] = costs
    if jobs:
        self._prefill(convs, conv_dicts)
    # each unit's prefix costs, from the batch's counts; a unit with a refused (or already
    # evicted) rendering is left for count_array, which reports the refusal where it renders it
    texts = self._texts
    for uck, ukeys, not_tool_first, at in jobs:
        counts = [texts.get((convs[i], None)) for i in range(at, at + len(ukeys) + 1)]
        if None in counts:
            continue
        costs = tuple([counts[j] - counts[j - 1] for j in range(1, len(counts))])  # type: ignore[operator]
        found[uck] = costs
        if not_tool_first:
            found_local[ukeys] = costs
    store_all(self, units, found)
    store_all(self, local_units, found_local)


@cython.ccall
def plan(self: CounterCore, pred: str, shapes: tuple[Any, ...], succ: str = "user") -> Any:
    """How to cost a unit whose messages have these frame shapes (``Frames.frame_of``),
    between the stand-ins ``pred`` and ``succ`` (a neighbour-independent unit: its canonical
    ``pred`` and "user"), from its field values alone.

    The canonical renderings of its prefixes (``pre + unit[:j] + post``) are frames: text
    pieces around the field values. Split at the tokenizer's added tokens (what
    ``_count_many`` does to a rendering), a frame is added tokens, runs of fixed text and
    runs that hold field values; so ``T_j`` (the tokens of prefix ``j``'s rendering) is a
    constant plus the counts of its value runs, and message ``j`` costs ``T_j - T_{j-1}``:
    a constant, plus the value runs ``T_j`` has and ``T_{j-1}`` has not, minus the
    reverse. The plan is ``(ops, runs, steps)``: every frame's recorded predicates (see
    ``_template_frames``), the value runs (``(items, next added token)``; an item is fixed
    text or a slot), and per message ``(constant, runs added, runs removed)``. A unit
    follows its plan when the predicates hold on its values and each value run, followed
    by its added token, holds no added token but that one (``_plan_texts``): then each
    rendering splits as planned (no added token's text holds another's,
    ``_split_is_prefix_free``), and the costs are exactly those of the renderings.

    None: no plan (a frame that renders); ``NOT_YET``: a frame not learned yet."""
    key = (pred, shapes) if succ == "user" else (pred, succ, shapes)
    plans: dict = self._plans
    plan = plans.get(key, NOT_YET)
    if plan is not NOT_YET:
        return plan
    pre, post = self._context(pred, succ)
    table = self._frames._frames
    frames = []
    for j in range(1, len(shapes) + 1):
        entry = table.get(pre + shapes[:j] + post, NOT_YET)
        if entry is NOT_YET:
            return NOT_YET
        frames.append(entry)
    try:
        plan = self._build_plan(self._tokens(pre + post), frames) if None not in frames else None
    except Refused:
        plan = None
    if len(plans) >= self.cache_size:
        _evict(self, plans)
    plans[key] = plan
    return plan


def planned_cost(self: CounterCore, keys: tuple, pred: str, succ: str) -> Optional[list[int]]:
    """The per-message costs of the unit ``keys`` between the stand-ins ``pred`` and ``succ``
    from its plan (see ``plan``): no rendering, its value runs counted (cached pieces); None
    where there is no plan (yet), or the unit does not follow it."""
    parts = unit_parts(self, keys)
    if parts is None:
        return None
    try:
        unit_plan = plan(self, pred, tuple([p[0] for p in parts]), succ)
    except TypeError:  # a field value that cannot be a key (as Frames.render)
        return None
    if unit_plan is None or unit_plan is NOT_YET:
        return None
    run_texts = plan_texts(self, unit_plan, [v for p in parts for v in p[1]])
    if run_texts is None:
        return None
    return step_costs(unit_plan[2], piece_counts(self, run_texts))


@cython.ccall
def unit_parts(self: CounterCore, keys: tuple) -> Optional[list]:
    """The frame parts of the unit ``keys`` (``frame_part``'s), or None where the counter has
    no plans or the unit's first message is no frame (no field value)."""
    if not (self._RENDER_FREE and self._plan_ok):
        return None
    parts_of: dict = self._frame_parts
    by_key: dict = self._by_key
    parts: list = []
    for k in keys:
        part = parts_of.get(k)
        if part is None:
            part = frame_part(self, k, by_key.get(k) or parse_key(k))
        parts.append(part)
    return parts if parts[0][1] else None


@cython.ccall
def planned_costs(self: CounterCore, keys: tuple, pairs: tuple) -> list:
    """``[planned_cost(self, keys, pred, succ) for pred, succ in pairs]``, each value run's
    text built and counted once: the plans of most neighbours differ in their constants only
    (the same predicates and value runs: ``plan_groups``), and those that differ mostly share
    runs."""
    out: list = [None] * len(pairs)
    parts = unit_parts(self, keys)
    if parts is None:
        return out
    try:
        groups = plan_groups(self, tuple([p[0] for p in parts]), pairs)
    except TypeError:  # a field value that cannot be a key (as Frames.render)
        return out
    values = [v for p in parts for v in p[1]]
    texts: list = []
    at: dict = {}  # value run -> its index in texts, -1 where the unit does not follow it
    work: list = []  # (the group's run indexes in texts, its members)
    for ops, runs, members in groups:
        if ops and not ops_hold(ops, values):
            continue
        idx: Optional[list] = []
        for run in runs:
            j = at.get(run)
            if j is None:
                text = run_text(self, run, values)
                if text is None:
                    j = -1
                else:
                    j = len(texts)
                    texts.append(text)
                at[run] = j
            if j < 0:
                idx = None
                break
            idx.append(j)  # type: ignore[union-attr]
        if idx is not None:
            work.append((idx, members))
    if not work:
        return out
    counts = piece_counts(self, texts)
    for idx, members in work:
        got = [counts[j] for j in idx]
        for i, steps in members:
            out[i] = step_costs(steps, got)
    return out


@cython.ccall
def plan_groups(self: CounterCore, shapes: tuple, pairs: tuple) -> tuple:
    """The plans of a unit with these frame shapes between each ``(pred, succ)`` of ``pairs``,
    grouped by their predicates and value runs: ``((ops, runs, ((pair index, steps), ...)),
    ...)``; a pair without a plan (or whose frames are not learned yet) is in no group.
    Cached (in ``self._plans``); where a pair's frames were not learned, only until the
    frame table grows."""
    key = ("groups", pairs, shapes)
    plans: dict = self._plans
    table: dict = self._frames._frames
    got = plans.get(key)
    if got is not None and (got[1] or got[2] == len(table)):
        return got[0]  # type: ignore[no-any-return]
    by: dict = {}
    learned = True
    for i, (pred, succ) in enumerate(pairs):
        p = plan(self, pred, shapes, succ)
        if p is NOT_YET:
            learned = False
        elif p is not None:
            by.setdefault((p[0], p[1]), []).append((i, p[2]))
    groups = tuple([(k[0], k[1], tuple(v)) for k, v in by.items()])
    if got is None and len(plans) >= self.cache_size:
        _evict(self, plans)
    plans[key] = (groups, learned, len(table))
    return groups


@cython.ccall
def prefill_planned(self: CounterCore, keys: tuple, pairs: Sequence[tuple[str, str]]) -> list:
    """Cost the unit ``keys`` from its plans between every ``(pred, succ)`` of ``pairs`` that
    ``self._units`` lacks, in one ``planned_costs`` call, into ``self._units`` (what
    ``_unit_cost`` would store for each: ``succ`` normalized as there; the pairs it costs
    otherwise, a unit opening the conversation before a system message, left to it; those
    without a plan, left to it too). Returns each pair's costs as ``self._units`` now holds
    them (None where it holds none: left to ``_unit_cost``), in the order of ``pairs``."""
    out: list = [None] * len(pairs)
    if not (self._RENDER_FREE and self._plan_ok):
        return out
    units: dict = self._units
    # the pairs to cost: their unit cache keys, (pred, succ) and indexes in pairs (two pairs
    # may normalize to one)
    todo_keys: list = []
    todo: list = []
    todo_at: list = []
    i: cython.Py_ssize_t = 0
    for pred, succ in pairs:
        succ = unit_succ(self, succ)
        if not (pred == "first" and (succ == "system" or succ == "system_final")):
            ck = (keys, pred, succ, None)
            c = units.get(ck)
            if c is not None:
                out[i] = c
            elif ck in todo_keys:
                todo_at[todo_keys.index(ck)].append(i)
            else:
                todo_keys.append(ck)
                todo.append((pred, succ))
                todo_at.append([i])
        i += 1
    if not todo:
        return out
    got: list = planned_costs(self, keys, tuple(todo))
    new: dict = {}
    j: cython.Py_ssize_t
    for j in range(len(todo)):
        c = got[j]
        if c is not None:
            c = tuple(c)
            new[todo_keys[j]] = c
            for i in todo_at[j]:
                out[i] = c
    store_all(self, units, new)
    return out


@cython.ccall
def unit_succ(self: CounterCore, succ: str) -> str:
    """The successor a unit is costed before (``_unit_cost``'s cache keys hold it): "end" is
    costed as "user"; so is every successor but "open" where units are costed before a user
    stand-in whatever follows them (``_succ_blind``)."""
    if succ == "end" or (self._succ_blind and succ != "open"):
        return "user"
    return succ


#: the successors of a unit that ``unit_total`` asks for under ``_final_rule`` and the charges
#: (``upper_costs``) do not: costed with the charges' (their plans mostly shared)
_AHEAD = ("call", "call_final", "user_final")


@cython.ccall
def upper_costs(self: CounterCore, keys: tuple, dicts: Sequence[dict[str, Any]], preds: list, succs: list,
                exact: tuple, caller: Optional[str] = None, final_after: bool = False) -> list[int]:
    """The most each message of a unit costs over the neighbours ``preds`` x ``succs``;
    the ``exact`` pair must render (a refusal there is the conversation's own) -- or, under
    ``_final_rule`` where a final answer follows the unit in the conversation
    (``final_after``), the pair with that final answer after its successor (gpt-oss prints a
    call's text only while none follows: a text it cannot print, content blocks, refuses
    the pair without one and not the conversation). Each pair
    is the real unit's own cost (from its plans where it has them, all in one
    ``prefill_planned`` call; else rendered by ``_unit_cost``): a stand-in unit's dependence
    on its neighbours is not the real one's (DeepSeek-V3 prints indentation before an
    assistant's text after some neighbours only, which merges with the text's first token
    or not)."""
    reasoning, local = unit_locality(self, keys, dicts)
    lone: list = []  # (pairs whose cost holds wherever the unit stands in its state)
    if reasoning:  # kept after the last user query (nothing closes the unit), or stripped
        if self._query_rule and caller is None and local_pattern(self, keys, dicts):
            # stripped (a user stand-in after it) it costs the same after any neighbour: once,
            # in the smallest context (the exact pair's, unless that one is kept); kept, a
            # call's as count_messages costs it (before a call stand-in: the pair it then finds
            # in the unit cache), an answer where nothing follows it
            if exact[1] == "open":
                lone.append((self._canonical(dicts[0]["role"]), "user"))
            succs = ["assistant_kept" if dicts[len(dicts) - 1]["role"] == "tool" else "open"]
        elif self._final_reasoning and caller is None and self._is_local(dicts, keys, True):
            # (gpt-oss) one cost wherever no final answer follows it, one wherever one does
            canon = self._canonical(dicts[0]["role"])
            lone += [(canon, "user"), (canon, "user_final")]
            succs = []
        else:
            succs = list(succs) + ["open"]
    elif local:
        try:
            best = list(self._unit_cost(keys, self._canonical(dicts[0]["role"]), "user", caller=caller))
        except Refused:
            # the smallest context is refused where the real one may not be (a template that
            # refuses a conversation opening with this unit): costed over its neighbours
            local = False
        else:
            if caller is None and dicts[0]["role"] != "tool":
                self._remember_local(keys, best)
            return best
    # the other neighbours, each successor as the unit cache keys hold it (``unit_succ``'s;
    # under ``_succ_blind`` every one but "open" is "user"), once each and without the exact
    # pair: a pair that normalizes to another is the same cost
    blind = self._succ_blind
    exact_key = (exact[0], "user" if exact[1] == "end" or (blind and exact[1] != "open") else exact[1])
    others: list = []
    for pred in preds:
        for succ in succs:
            if pred == "first" and succ == "system":
                continue
            pair = (pred, "user" if succ == "end" or (blind and succ != "open") else succ)
            if pair != exact_key and pair not in others:
                others.append(pair)
    if reasoning and ("user", "open") != exact_key and ("user", "open") not in others and (
            "assistant" in preds or "call" in preds):
        # after an assistant stand-in, "open" also counts what the stand-in loses as the last
        # message no more (Qwen3's empty think block: 4 tokens under); after a real assistant
        # message no query between, the unit is kept as it is after a user query
        others.append(("user", "open"))
    for pair in lone:
        if pair != exact_key and pair not in others:
            others.append(pair)
    units: dict = self._units
    planned: list
    if caller is None:
        # each pair's costs from its plans (under _final_rule, also those of the successors an
        # exact count of the grown prompt asks for)
        planned = prefill_planned(self, keys, [exact] + others + ([(exact[0], s) for s in _AHEAD] if self._final_rule else []))
    else:
        planned = [units.get((keys, exact_key[0], exact_key[1], caller))] + [
            units.get((keys, pred, succ, caller)) for pred, succ in others]  # (_unit_cost's cache, looked up here)
    try:
        got = planned[0]
        best = list(got if got is not None else self._unit_cost(keys, exact[0], exact[1], caller=caller))
    except Refused as exc:
        got = None
        if final_after and self._final_rule and exact[1] in ("user", "system"):
            try:
                got = self._unit_cost(keys, exact[0], exact[1] + "_final", caller=caller)
            except Refused:
                pass
        if got is None:
            raise MessageValidationError(f"the chat template refused the conversation: {exc}") from None
        best = list(got)
    o: cython.Py_ssize_t
    for o in range(len(others)):
        pred, succ = others[o]
        c = planned[o + 1]
        if c is None:
            try:
                c = self._unit_cost(keys, pred, succ, caller=caller)
            except Refused:
                continue
        if len(c) < len(best):
            del best[len(c):]
        for j in range(len(best)):
            if c[j] > best[j]:
                best[j] = c[j]
    return best


@cython.ccall
def step_costs(steps: Sequence[tuple[int, Sequence[int], Sequence[int]]], got: Sequence[int]) -> list[int]:
    """Per-message costs from a plan's steps and its value runs' counts ``got``: each
    message's constant, plus the runs its prefix adds, minus those it removes.

    >>> step_costs([(3, [0], []), (2, [1], [0])], [5, 7])
    [8, 4]
    """
    costs: list = []
    for base, plus, minus in steps:
        cost = base
        for i in plus:
            cost += got[i]
        for i in minus:
            cost -= got[i]
        costs.append(cost)
    return costs


@cython.ccall
def plan_texts(self: CounterCore, plan: Any, values: Sequence[str]) -> Optional[list[str]]:
    """The texts of ``plan``'s value runs for a unit's field ``values``; None when the unit
    does not follow the plan (see ``_plan``)."""
    ops, runs, _ = plan
    if ops and not ops_hold(ops, values):
        return None
    texts: list = []
    for run in runs:
        text = run_text(self, run, values)
        if text is None:
            return None
        texts.append(text)
    return texts


@cython.ccall
def run_text(self: CounterCore, run: tuple, values: Sequence[str]) -> Optional[str]:
    """The text of a plan's value run ``(items, next added token)`` for a unit's field
    ``values``; None where it holds an added token (or runs into one) other than its next.
    A run holding a long string value (past ``_UNCACHED_RUN`` characters: a tool output) is
    kept among the ``_LONG_RUNS`` such used last (``self._run_texts``): a unit costed between
    several neighbours, or again by the exact count, escapes, joins and scans it once, and
    counts the same string (``piece_counts`` finds a long one by its identity). Such a run is
    kept under its form -- its next token, its fixed texts, and for each slot its value's
    identity (negated, less one, for a ``tojson`` slot) -- not the slots' indexes: another
    plan's equal run, or a run whose unit's values stand after other values (DeepSeek-V3's
    unit costed after the real system message: the plan of the two), finds it. The entry holds
    the values themselves: while it lives, no other object has their ids; hashing a tool
    output is a pass over it, as long as tokenizing a tenth of it. The same values in other
    objects (another message with the same output) build the text again."""
    items, next_token = run
    long = False  # (a long value, and every value a str)
    for x in items:
        if type(x) is not str:
            v = slot_value(values, x if x >= 0 else -1 - x)
            if type(v) is not str:
                long = False
                break
            long = long or len(v) > _UNCACHED_RUN
    if not long:
        return run_text_of(self, items, next_token, values)
    held: list = []
    form: list = [next_token]
    for x in items:
        if type(x) is str:
            form.append(x)
        elif x >= 0:
            v = slot_value(values, x)
            held.append(v)
            form.append(id(v))
        else:
            v = slot_value(values, -1 - x)
            held.append(v)
            form.append(-1 - id(v))
    key = tuple(form)  # (flat: strings whose hashes they keep, and ints)
    memo: dict = self._run_texts
    got = recall(memo, key, None)
    if got is None:
        text = run_text_of(self, items, next_token, values)
        keep_last(self, memo, key, (tuple(held), text))
        return text
    return got[1]  # type: ignore[no-any-return]


@cython.ccall
def run_text_of(self: CounterCore, items: tuple, next_token: str, values: Sequence[str]) -> Optional[str]:
    """``run_text``'s text, built and checked."""
    pieces: list = []
    for x in items:
        if type(x) is str:
            pieces.append(x)
        elif x >= 0:
            pieces.append(slot_value(values, x))
        else:  # a tojson slot: json_inside(v), escaped here for a str
            v = slot_value(values, -1 - x)
            pieces.append(json_escaped(v) if type(v) is str else json_inside(v))
    text = "".join(pieces)
    if holds_token(self, text, next_token):
        return None
    return text


@cython.ccall
def holds_token(self: CounterCore, text: str, next_token: str) -> bool:
    """Whether an added token starts in ``text`` followed by ``next_token`` (an added token,
    or ""): ``self._search(text + next_token)`` finds one before ``len(text)`` -- inside the
    text, or running from it into the next token.

    A short text (up to ``_HEAD_SCAN`` characters) is looked at for the tokens' heads first:
    no head in it, and a last character that starts none, is no token (a head looked for only
    where its first character occurs: one character is a memchr scan; JSON and prose rarely
    hold "<"); else the search decides. A long one (a tool output) is searched group by group
    (``token_searches``: the tokens sharing a first character, one pattern each, where that
    character occurs): a head of two characters is a slower scan than such a pattern's (~0.7
    ns a character each, where a coding agent's tool output holds "[" and "<": 29 us for a 10
    kB output against Mistral's seven heads; the whole alternation, no common first character,
    ~3 ns a character)."""
    n = len(text)
    groups = self._token_head_groups
    if n > _HEAD_SCAN and groups is not None:
        s = None
        for c, search in self._token_searches:
            if c in text:
                if s is None:
                    s = text + next_token
                m = search(s)
                if m is not None and m.start() < n:
                    return True
        return False
    firsts: str = self._token_firsts
    clean = not n or text[n - 1] not in firsts
    if clean:
        if groups is None:
            clean = False
        else:
            for c, hs in groups:
                if c in text:
                    for h in hs:
                        if h in text:
                            clean = False
                            break
                    if not clean:
                        break
    if clean:
        return False
    search = self._search
    if next_token:
        return search(text + next_token).start() != n  # type: ignore[no-any-return]  # (it finds next_token at least)
    return search(text) is not None


#: a value run longer than this is searched for added tokens group by group (``holds_token``)
_HEAD_SCAN = 256


def token_searches(contents: Sequence[str]) -> tuple:
    """The added tokens ``contents`` grouped by first character: ``((c, search), ...)``,
    ``search`` a pattern's ``search`` for the tokens starting with ``c`` (longest first, as the
    whole tokens' pattern), for ``holds_token``; empty tokens left out (``head_groups`` then
    is None: every text holds one, the whole search decides).

    >>> [(c, s("a[/INST]") is not None) for c, s in token_searches(["[INST]", "[/INST]", "</s>", ""])]
    [('<', False), ('[', True)]
    """
    by: dict = {}
    for t in contents:
        if t:
            by.setdefault(t[0], []).append(t)
    return tuple([(c, re.compile("|".join([re.escape(t) for t in sorted(ts, key=len, reverse=True)])).search)
                  for c, ts in sorted(by.items())])


def head_groups(heads: tuple) -> Optional[tuple]:
    """``heads`` (the added tokens' first two characters) by first character: ``((c, heads
    starting with c), ...)``, so that a text holds a head iff, for some group, it holds ``c``
    and one of the group's heads; None when a head is empty (an empty token: every text
    holds it, the search always runs).

    >>> head_groups(("</", "<t", "[/", "[A"))
    (('<', ('</', '<t')), ('[', ('[/', '[A')))
    >>> head_groups(("", "<|")) is None
    True
    """
    if "" in heads:
        return None
    out: dict = {}
    for h in heads:
        out.setdefault(h[0], []).append(h)
    return tuple([(c, tuple(hs)) for c, hs in out.items()])


@cython.ccall
def slot_value(values: Sequence[str], x: int) -> Any:
    """The value of a frame's slot ``x`` (``>= 0``) for the field ``values``: a field's own, or
    what a derivation makes of it (see ``DERIVED``).

    >>> slot_value(["a", "\\nb\\n"], 1 + derivation_id("lstrip", "\\n") * DERIVED)
    'b\\n'
    """
    if x < DERIVED:
        return values[x]
    k = x // DERIVED
    name, chars = _DERIVATIONS[k]
    v = values[x - k * DERIVED]
    if name == "strip":
        return v.strip(chars)
    if name == "lstrip":
        return v.lstrip(chars)
    return v.rstrip(chars)


@cython.ccall
def ops_hold(ops: Sequence[tuple[Any, ...]], values: Sequence[str]) -> bool:
    """Whether a frame's recorded truth tests and predicates (``ops``), replayed on the
    field ``values``, give the recorded answers (then the template takes the same path).

    >>> ops_hold([(0, "startswith", ("a",), True), (1, "__bool__", (), True)], ["abc", "x"])
    True
    >>> ops_hold([(0, "__contains__", ("x",), False)], ["xyz"])
    False
    """
    for slot, name, args, res in ops:
        v = slot_value(values, slot)
        if name == "__bool__":
            got = len(v) > 0
        elif name == "__dictbool__":
            got = v != "{}"
        else:
            got = getattr(str, name)(v, *args)
        if got != res:
            return False
    return True


#: a value run longer than this is kept out of the piece cache (a turn's new text: its unit's
#: costs are cached), in a smaller one of the most recently used instead (``_LONG_RUNS`` of
#: them: a unit costed next to several neighbours repeats its runs, the unit a moving cut
#: leaves after the system prompt is costed there again, its runs counted a window ago; the
#: system prompt's own run, used every turn, stays)
_UNCACHED_RUN = 256
_LONG_RUNS = 256
#: past this many characters a piece is cached by its identity (see ``piece_counts``)
_HUGE_PIECE = 2048


@cython.ccall
def piece_counts(self: CounterCore, pieces: list[str]) -> list[int]:
    """Tokens of each piece (text without added tokens; the counts in the pieces' order),
    cached; the new ones encoded in one batch (a piece longer than ``_UNCACHED_RUN``
    characters is kept only among the ``_LONG_RUNS`` such pieces used last: a unit costed next
    to several neighbours, whose long value runs repeat, counts them once). A piece longer
    than ``_HUGE_PIECE`` characters (a tool output's run: ``run_text`` keeps its string) is
    kept under its identity, with itself (no pass over it to hash it); an equal piece in
    another string is counted again."""
    cache: dict = self._pieces
    longs: dict = self._long_pieces
    out: list = []
    texts: list = []  # what to encode: each new piece once
    new: dict = {}  # new short piece -> its index in texts
    new_long: dict = {}  # new long piece (a huge one: its id) -> its index in texts
    pending: list = []  # indexes of out that hold an index in texts
    for piece in pieces:
        size = len(piece)
        long = size > _UNCACHED_RUN
        name = piece
        if size > _HUGE_PIECE:
            name = id(piece)
            e = recall(longs, name, None)
            n = None if e is None else e[1]
        elif long:
            n = recall(longs, piece, None)
        else:
            n = cache.get(piece)
        if n is None:
            fresh: dict = new_long if long else new
            j = fresh.get(name)
            if j is None:
                j = fresh[name] = len(texts)
                texts.append(piece)
            pending.append(len(out))
            out.append(j)
        else:
            out.append(n)
    if texts:
        got = encode_lengths(self, texts)
        for i in pending:
            out[i] = got[out[i]]
        if new:
            store_all(self, cache, {piece: got[j] for piece, j in new.items()})
        for name, j in new_long.items():  # (a huge piece by its id, the entry holding it)
            keep_last(self, longs, name, (texts[j], got[j]) if type(name) is int else got[j])
    return out


@cython.ccall
def recall(cache: dict, key: Any, default: Any) -> Any:
    """``cache.get(key, default)`` for a cache ``keep_last`` keeps: a key found is put back
    last (used last: kept longest).

    >>> c = {"a": 1, "b": 2}
    >>> recall(c, "a", None), list(c), recall(c, "z", 0)
    (1, ['b', 'a'], 0)
    """
    got = cache.pop(key, NOT_YET)
    if got is NOT_YET:
        return default
    cache[key] = got
    return got


@cython.ccall
def keep_last(self, cache: dict, key: Any, value: Any) -> None:
    """``cache[key] = value``, ``cache`` kept within ``_LONG_RUNS`` keys (at most
    ``self.cache_size``): where it is full, its oldest quarter (at least what is over) is
    dropped at once (a key used again is put back last: the least recently used dropped).
    Not one key per store: a dict leaves a dead slot where a key was deleted, until it is
    resized, and finding its first key walks the dead slots before it -- dropping the
    oldest one at a time walked ~200 of them per store.

    >>> class Owner: cache_size = 4
    >>> c = {k: k for k in "abcd"}
    >>> keep_last(Owner(), c, "e", "e"); list(c)
    ['b', 'c', 'd', 'e']
    """
    keep = min(_LONG_RUNS, self.cache_size)
    n = len(cache)
    if n >= keep:
        for old in list(_ISLICE(cache, max(keep // 4, n - keep + 1))):  # (the oldest)
            del cache[old]
    cache[settle(key)] = settle(value)


@cython.ccall
def encode_lengths(self: CounterCore, texts: list[str]) -> list[int]:
    """``self._encode_lengths(texts)`` for pieces that hold no added token (a unit plan's value
    runs, checked by ``plan_texts``): a small batch on fastokens (the turn's new value runs)
    encoded here, text by text (what ``_encodings.fastokens_counts`` does below
    ``self._FAST_LOOP_CHARS`` characters) by its ``encode_ordinary`` (the base pipeline
    without the added-vocabulary split, which has nothing to split in such a piece: the same
    tokens without its per-call search and encoding object); anything else through
    ``_encode_lengths``."""
    fast = self._fast
    if fast is not None:
        total = 0
        for t in texts:
            total += len(t)
        if total < self._FAST_LOOP_CHARS:
            try:
                ordinary = fast.encode_ordinary  # (a fastokens without it: encode, below)
            except AttributeError:
                ordinary = None
            try:
                if ordinary is not None:
                    return [len(ordinary(t)) for t in texts]
                encode = fast.encode
                return [len(encode(t, add_special_tokens=False)) for t in texts]
            except Exception:  # _encode_lengths falls back to tokenizers
                pass
    return list(self._encode_lengths(texts))


@cython.ccall
def frame_part(self: CounterCore, key: str, d: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    """``Frames.frame_of(d)`` for a real message (cached by key); a stand-in (its key has
    no NUL: a JSON dict) is fixed text of its frame."""
    parts: dict = self._frame_parts
    part = parts.get(key)
    if part is None:
        if "\0" not in key and not isinstance(d.get("content"), list):  # (content blocks: a frame's slots)
            part = (key, ())
        else:
            part = plain_frame(self._frames._fields, d) if "tool_calls" not in d else None
            if part is None:
                part = self._frames.frame_of(d)
        if len(parts) >= self.cache_size:
            _evict(self, parts)
        parts[key] = settle(part)
    return part


def plain_frame(fields: Sequence[str], d: Mapping[str, Any]) -> Optional[tuple[Any, tuple[str, ...]]]:
    """``Frames.frame_of(d)`` for a dict without tool calls whose values are all strings
    (the usual message); None for any other dict.

    >>> from jianmu_fast.memory.context._template_frames import Frames
    >>> d = {"role": "tool", "content": "ok", "tool_call_id": ""}
    >>> plain_frame(("content", "name", "tool_call_id"), d) == Frames(lambda ds: "").frame_of(d)
    True
    """
    values: list = []
    shape: list = []
    for k, v in d.items():
        if type(v) is not str:
            return None
        if v and k in fields:
            values.append(v)
            shape.append((k, None))
        else:
            shape.append((k, ("str", v)))
    return tuple(shape), tuple(values)


@cython.ccall
def entries_stable(self: CounterCore, ms: Sequence[Any], offset: int = 0) -> tuple[list[str], list[dict[str, Any]], bool]:
    """``(keys, dicts, stable)`` of ``ms`` (``offset``: the index of ``ms[0]`` in the call,
    for error messages); ``stable``: every message is a memoized immutable ``Message``
    (its key cannot change while it lives)."""
    keys: list = []
    dicts: list = []
    memo: dict = self._memo
    stable = True
    i: cython.Py_ssize_t
    for i in range(len(ms)):
        m = ms[i]
        mid = id(m)
        e = memo.get(mid)  # _entry's memo hit, inlined (the hot loop's per-message cost)
        if e is not None and e[1] is None and e[0]() is m:
            keys.append(e[3])
            dicts.append(e[2])
            continue
        k, d = entry(self, m, offset + i)
        keys.append(k)
        dicts.append(d)
        if stable:
            e = memo.get(mid)
            stable = e is not None and e[1] is None and e[0]() is m
    return keys, dicts, stable


@cython.ccall
def shared_run(prev: list, cur: list) -> Optional[tuple]:
    """``(p, q)`` where ``cur`` is ``prev``'s first ``p`` items, then all of ``prev`` from ``q``
    on, then new items -- compared by identity, item by item (a few C-level pointer compares
    per item, no hashing) --, ``p`` 1 then 0 as ``overlap`` tries them (a cut moved after a
    pinned first message, or with none) and ``(0, 0)`` where ``cur`` extends ``prev``; None
    where it is neither (``call_entries``' match of a call's messages to the last call's,
    ``role_positions``' of a prompt's keys to the last prompt's).

    >>> a, b, c, d = "a", "b", "c", "d"
    >>> shared_run([a, b], [a, b, c]), shared_run([a, b, c], [a, c, d]), shared_run([a, b], [c, a])
    ((0, 0), (1, 2), None)
    """
    k: cython.Py_ssize_t = len(prev)
    n: cython.Py_ssize_t = len(cur)
    lim: cython.Py_ssize_t = k if k < n else n
    same: cython.Py_ssize_t = lim  # how many first items are the previous ones
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    t: cython.Py_ssize_t
    p: cython.Py_ssize_t
    q: cython.Py_ssize_t
    for i in range(lim):
        if cur[i] is not prev[i]:
            same = i
            break
    if same == k:  # cur extends prev
        return (0, 0)
    for p in range(1 if same > 0 and n > 1 else 0, -1, -1):
        x = cur[p]
        q = -1
        for j in range(p, k):
            if prev[j] is x:
                q = j
                break
        if q < 0 or k - q > n - p:
            continue
        d = q - p
        for t in range(q + 1, k):
            if cur[t - d] is not prev[t]:
                break
        else:
            return (p, q)
    return None


@cython.ccall
def call_entries(self: CounterCore, ms: list[Any]) -> tuple[list[str], list[dict[str, Any]], Optional[tuple[int, int, int]]]:
    """``_entries(ms)`` for ``count_messages``, and ``overlap``'s answer where the messages
    tell it. When ``ms`` shares messages with the previous call's (the same immutable
    objects: the prompt extends it, or the trimming moved its cut after a pinned first
    message or none), only the others are looked up; the shared ones' keys and dicts are
    the previous call's. Which messages are shared is checked by identity, message by
    message (a list the caller reuses, changes or replaces between calls is never trusted:
    a few C-level pointer compares per message, no lookups, no hashing), the way ``overlap``
    checks keys: ``(p, q, m)`` with ``ms[p:p + m]`` the previous messages ``[q:]`` (and
    ``ms[:p]`` its first ``p``), returned when the previous call was the last segmented one
    and ``q`` starts a unit there (so that ``overlap(self, keys)`` would hold for it), else
    None (``count_messages`` then asks ``overlap``)."""
    last = self._last_ms
    ov = None
    if last is not None:
        prev: list = last[0]
        run = shared_run(prev, ms)
        if run is not None:
            ov = (run[0], run[1], len(prev) - run[1])
    if ov is None:
        keys, dicts, stable = entries_stable(self, ms)
    else:
        op, oq, om = ov
        lkeys: list = last[1]
        ldicts: list = last[2]
        keys, dicts, stable = entries_stable(self, ms[op + om:], op + om)
        if op:
            keys = lkeys[:op] + lkeys[oq:] + keys
            dicts = ldicts[:op] + ldicts[oq:] + dicts
        elif oq:
            keys = lkeys[oq:] + keys
            dicts = ldicts[oq:] + dicts
        elif keys:
            keys = lkeys + keys
            dicts = ldicts + dicts
        else:  # the same prompt again (count_tools right after count_messages): its lists, not copies
            keys = lkeys
            dicts = ldicts
        seg = self._last
        if seg is None or seg[0] is not lkeys:
            ov = None  # the previous call was not the last segmented one
        elif oq:
            lstarts: list = seg[1]
            u = bisect_ints(lstarts, oq)
            if u == len(lstarts) or lstarts[u] != oq:
                ov = None
    self._last_ms = (ms, keys, dicts) if stable else None
    return keys, dicts, ov


def user_repeats(self: CounterCore, ms: list[Any]) -> list[int]:
    """Indexes of the user messages of ``ms`` before its last one that equal it as the
    template sees them (their dicts: Mistral's template prints the tools again before each).
    Its entries as ``count_messages`` gets them (``call_entries``: the messages shared with
    the previous call are not looked up again; a budget filter asks this of every output it
    sends with tools that the template may repeat, right before the prompt is counted)."""
    if not ms:
        return []
    keys, dicts, _ = call_entries(self, ms)
    return repeats_of_last(dicts, role_positions(self, keys, dicts)[1])


@cython.ccall
def repeats_of_last(dicts: list, users: list) -> list:
    """The indexes in ``users`` (where a prompt's user messages stand, in order) of the user
    messages before the last one whose dicts equal its (``user_repeats``'; ``tools_signature``
    counts them).

    >>> u, v = {"role": "user", "content": "go"}, {"role": "user", "content": "hi"}
    >>> repeats_of_last([u, v, dict(u), u], [0, 1, 2, 3])
    [0, 2]
    """
    out: list = []
    if len(users) < 2:
        return out
    last = dicts[users[len(users) - 1]]
    u: cython.Py_ssize_t
    for u in range(len(users) - 1):
        if dicts[users[u]] == last:
            out.append(users[u])
    return out


def tools_signature(self: CounterCore, ms: list[Any], opening: bool, first_user: bool, last_user: bool,
                    no_user: bool = False) -> Optional[tuple[Any, ...]]:
    """What the marginal cost of a tool list may depend on in the prompt ``ms`` (non-empty),
    for a template whose probes (``ChatTemplateTokenCounter._tools_parts``) found it depends on
    nothing else: the first message's key and every system message's (DeepSeek-V3's template
    joins them all into one system block, the tools after it); the keys of the first message that is not a system
    message (Llama 3.1's template prints the tools into it, whatever its role), of the first
    user message and of the last one, each only where the probes found it matters
    (``opening``, ``first_user``, ``last_user``); whether the first and last user messages are
    one message; how many earlier user messages equal the last one (Mistral's template prints
    the tools before each); and the last message's role. A prompt without a user message (a
    coding agent's trimmed prompt: tool rounds only) has a signature of its own (no user keys,
    ``None`` where the others say whether the first and last are one) where ``no_user`` (the
    probes found such prompts depend on nothing else either), None otherwise."""
    keys, dicts, _ = call_entries(self, ms)
    n: cython.Py_ssize_t = len(dicts)
    pos = role_positions(self, keys, dicts)
    systems: list = pos[0]
    users: list = pos[1]
    o: cython.Py_ssize_t = 0  # the first message that is not a system message (systems are sorted)
    while o < len(systems) and systems[o] == o:
        o += 1
    head = keys[o] if opening and o < n else None
    system_keys = tuple([keys[i] for i in systems])
    if not users:
        if not no_user:
            return None
        return (keys[0], system_keys, head, None, None, None, 0, dicts[n - 1]["role"])
    f: cython.Py_ssize_t = users[0]  # the first user message
    j: cython.Py_ssize_t = users[len(users) - 1]  # the last one
    return (keys[0], system_keys, head, keys[f] if first_user else None, keys[j] if last_user else None, f == j,
            len(repeats_of_last(dicts, users)), dicts[n - 1]["role"])


@cython.ccall
def role_positions(self: CounterCore, keys: list, dicts: list) -> tuple:
    """``(systems, users)``: the indexes of the system and of the user messages of a prompt
    (its entries, ``call_entries``'), for ``tools_signature``. Only the roles of messages the
    last prompt asked about (``self._role_pos``: its keys and answer) did not hold are read:
    where this prompt is the last one's first ``p`` messages (1 or 0, as ``call_entries``
    tries them), then its messages from ``q`` on (all of them: the prompt extends it, or its
    cut moved), then new ones, the positions of the shared ones are the last answer's,
    shifted; the shared messages are checked by the identity of their keys, key by key (a
    key is its message's template dict printed: the same key object, the same role).
    Anything else reads every role."""
    n: cython.Py_ssize_t = len(keys)
    systems: list = []
    users: list = []
    start: cython.Py_ssize_t = 0  # the first message whose role is read
    i: cython.Py_ssize_t
    p: cython.Py_ssize_t
    q: cython.Py_ssize_t
    last = self._role_pos
    if last is not None and last[0] is keys:  # (the same entries: call_entries' for the same prompt)
        return (last[1], last[2])
    if last is not None:
        pk: list = last[0]
        run = shared_run(pk, keys)
        if run is not None:
            p = run[0]
            q = run[1]
            psys: list = last[1]
            pusers: list = last[2]
            for x in psys:
                if x < p:
                    systems.append(x)
                elif x >= q:
                    systems.append(x - q + p)
            for x in pusers:
                if x < p:
                    users.append(x)
                elif x >= q:
                    users.append(x - q + p)
            start = p + len(pk) - q
    for i in range(start, n):
        role = dicts[i]["role"]
        if role == "system":
            systems.append(i)
        elif role == "user":
            users.append(i)
    got = (systems, users)
    self._role_pos = (keys, systems, users)
    return got


#: the leaves ``json_snapshot`` accepts (immutable: the same object is the same value)
_JSON_LEAVES = (str, int, float, bool)


@cython.ccall
def json_snapshot(o: Any) -> Optional[list]:
    """What ``json_unchanged`` checks ``o`` against later: each list and dict of the JSON tree
    ``o`` (``o`` first), once each, with its direct contents as a tuple (a dict's keys and
    values in turn); None where ``o`` is not a list or a dict, or holds anything but lists,
    dicts, strings, numbers, booleans and None (a tuple, a mapping of another type: the
    caller compares values instead).

    >>> t = [{"type": "function", "function": {"name": "f"}}]
    >>> [type(c).__name__ for c, _ in json_snapshot(t)], json_snapshot([(1, 2)])
    (['list', 'dict', 'dict'], None)
    """
    t = type(o)
    if t is not dict and t is not list:
        return None
    out: list = []
    seen: set = set()
    todo: list = [o]
    while todo:
        x = todo.pop()
        if id(x) in seen:  # (one container in two places: recorded once)
            continue
        seen.add(id(x))
        items: list = []
        if type(x) is dict:
            for k, v in x.items():
                if not (k is None or type(k) in _JSON_LEAVES):
                    return None
                items.append(k)
                items.append(v)
        else:
            items = list(x)
        for v in items:
            tv = type(v)
            if tv is dict or tv is list:
                todo.append(v)
            elif not (v is None or tv in _JSON_LEAVES):
                return None
        out.append((x, tuple(items)))
    return out


def _json_unchanged(snap: list, o: Any) -> bool:
    """Whether the JSON tree ``o`` is what ``json_snapshot`` recorded: ``o`` a list or dict of
    the recorded top's type holding the same objects in the same order (``o`` itself may be
    another object: a new list of the same tool dicts), and every other recorded list and
    dict still holding the same objects in the same order. Then ``o`` is the value it was,
    printed alike: no container changed, the rest are immutable. Identity checks only
    (``==`` against a copy also takes ``1.0`` for ``1``; the compiled build's, on borrowed
    references: 14 tools, 634 items, ~1.8 us where ``==`` took ~3.1-3.5); False for any change,
    also one back to an equal value (the caller compares values then).

    >>> t = [{"a": [1, 2]}]
    >>> snap = json_snapshot(t)
    >>> json_unchanged(snap, t), json_unchanged(snap, list(t))
    (True, True)
    >>> t[0]["a"][0] = 1.0; json_unchanged(snap, t)
    False
    """
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    for i in range(len(snap)):
        rec: tuple = snap[i]
        c = rec[0]
        x = o if i == 0 else c
        items: tuple = rec[1]
        if type(x) is not type(c):
            return False
        if type(x) is dict:
            d: dict = x
            if 2 * len(d) != len(items):
                return False
            j = 0
            for k, v in d.items():
                if k is not items[j] or v is not items[j + 1]:
                    return False
                j += 2
        else:
            seq: list = x
            if len(seq) != len(items):
                return False
            for j in range(len(items)):
                if seq[j] is not items[j]:
                    return False
    return True


try:  # the compiled build's (csrc/_template_core.pyx: borrowed references, no counting), as settle's
    json_unchanged = _json_unchanged_compiled  # type: ignore[name-defined]  # noqa: F821
except NameError:
    json_unchanged = _json_unchanged


@cython.ccall
def same_json(a: Any, b: Any) -> bool:
    """``a == b``, and printed alike by a template's ``tojson``: of the same types throughout
    (``1``, ``1.0`` and ``True`` are equal), dict keys in the same order, floats of the same
    ``repr`` (``0.0`` and ``-0.0`` are equal; NaN is never the same). A string leaf (most of a
    tool list's) is compared where it stands, without a call, and a dict's keys in step with
    the other's, without listing them (7.7 us on the 14-tool regime list, from 33 us: an
    agent that rebuilds its tool list every turn pays this once a turn)."""
    t = type(a)
    if t is not type(b):
        return False
    if t is dict:
        da: dict = a
        db: dict = b
        if len(da) != len(db):
            return False
        keys_b = iter(db)
        for k, v in da.items():
            k2 = next(keys_b)
            if k is not k2 and k != k2:
                return False
            w = db[k2]
            if type(v) is str:
                if type(w) is not str or v != w:
                    return False
            elif not same_json(v, w):
                return False
        return True
    if t is list:
        la: list = a
        lb: list = b
        n = len(la)
        if n != len(lb):
            return False
        i: cython.Py_ssize_t
        for i in range(n):
            v = la[i]
            w = lb[i]
            if type(v) is str:
                if type(w) is not str or v != w:
                    return False
            elif not same_json(v, w):
                return False
        return True
    if t is tuple:
        if len(a) != len(b):
            return False
        for v, w in zip(a, b):
            if not same_json(v, w):
                return False
        return True
    if t is float:
        return a == b and repr(a) == repr(b)
    return bool(a == b)


@cython.ccall
def entry(self: CounterCore, m: Any, i: int) -> tuple[str, dict[str, Any]]:
    memo: dict = self._memo
    mid = id(m)
    e = memo.get(mid)
    if e is not None and e[0]() is m and (e[1] is None or (m.content, m.tool_calls) == e[1]):
        return e[3], e[2]
    if type(m) is Message or isinstance(m, Message):
        msg = m
    elif isinstance(m, Mapping) and "role" in m and not isinstance(m, Message):
        msg = coerce_message(m, f"messages[{i}]")
    else:
        raise MessageValidationError(f"messages[{i}]: expected a Message or a chat-completions dict, got {type(m).__name__}")
    own = msg is m  # (memoized by its identity; a copy made here is keyed by the original's)
    # (a Message's fields read from its __dict__: an attribute read passes pydantic's hook first)
    mf: dict = _instance_dict(msg) if type(msg) is Message else _fields_of(msg)
    mine: dict = mf  # (m's own fields, for its snapshot below)
    if self._content_format is not None:  # vLLM's content (see _content_format), where it is not the same
        c = mf["content"]
        if (c is not None and type(c) is not str) or (c == "" if self._content_format == "openai" else c is None):
            msg = self._formatted(msg, i)
            mf = _instance_dict(msg) if type(msg) is Message else _fields_of(msg)
    d: dict
    part = None
    t = None  # its trait (``trait``'s), where the one-pass entries know it
    made = bool(mf["tool_calls"])  # the dict is call_entry's (made here), where it answers
    extra = mf["extra"]
    # an assistant's reasoning where the template prints none of it (``_reads_reasoning``):
    # the message as without it (the dicts and keys below leave it out)
    sensitive: frozenset = self._sensitive
    bare = bool(extra) and mf["role"] == "assistant" and _only_reasoning(extra)
    # where the template reads it, one reasoning field holding a str: the one-pass entry of
    # the message without it, the reasoning put in (``reasoning_entry``)
    thought = None
    if bare and "reasoning" in sensitive:
        if len(extra) == 1:
            for k, v in extra.items():
                if type(v) is str:
                    thought = (k, v)
        bare = thought is not None
    got = call_entry(msg, bare) if made else plain_entry(msg, self._frames._fields, bare)
    if got is not None:
        if thought is not None:
            got = reasoning_entry(got, thought[0], thought[1])
        d, key, part = got
        role = d["role"]
        content = d["content"]
        n_calls = len(d.get("tool_calls") or ())
        think_text = role == "assistant" and content != "" and "</think>" in content
        call_text = n_calls > 0 and content != ""
        # (trait's lookahead: reasoning the template reads, or a text feature it looks ahead for)
        look = thought is not None or (bool(sensitive) and (
            (call_text and "call_text" in sensitive) or (think_text and "think_text" in sensitive)))
        t = trait_value(look, role, n_calls, thought is not None, call_text, think_text)
    else:
        made = False
        got = None if mf["tool_calls"] else block_entry(msg, self._frames._fields)
        if got is not None:  # content blocks (its trait: trait's, when asked)
            d, key, part = got
        else:
            d = message_to_template_dict(msg)
            if d["role"] == "assistant" and _has_reasoning(d) and "reasoning" not in sensitive:
                # a template that prints none of an assistant's reasoning (``_reads_reasoning``):
                # the dict without it renders the same, and is a frame's like any other message's
                d = {k: v for k, v in d.items() if k not in _REASONING_FIELDS}
            key = message_key(d)
            if "\0" in key and "tool_calls" not in d:  # its frame part now (frame_part's), in the same section
                part = plain_frame(self._frames._fields, d)
    calls = d.get("tool_calls")
    snap = None  # frozen lists (every validated Message) cannot change: no snapshot
    if own and (calls is not None or type(mine["content"]) is not str):
        c0 = mine["content"]
        t0 = mine["tool_calls"]
        if (isinstance(c0, list) and type(c0) is not FrozenList) or (t0 is not None and type(t0) is not FrozenList):
            snap = (copy.deepcopy(c0), copy.deepcopy(t0))
    size = self.cache_size  # (stores without the lock: see _evict)
    if t is not None:
        looks: dict = self._looks
        if len(looks) >= size:
            _evict(self, looks)
        looks[key] = t
    if part is not None:
        parts: dict = self._frame_parts
        if len(parts) >= size:
            _evict(self, parts)
        parts[key] = settle(part)
    if calls:  # which assistant message made each call (for tool-first slices)
        calls_of: dict = self._calls
        for call in calls:
            if isinstance(call.get("id"), str):
                if len(calls_of) >= size:
                    _evict(self, calls_of)
                calls_of[call["id"]] = key
    if made:  # (call_entry's: dicts and lists made here, of strings and parsed JSON)
        settle(d)
    if own:
        if len(memo) >= size:
            _evict(self, memo)
        memo[mid] = settle_entry((_weak_ref(m), snap, d, key))
    # (a chat-completions dict's too: its template dict is made of the Message it was
    # validated into, not of the caller's objects; its key is counted toward MAX_KEY_CHARS)
    by_key: dict = self._by_key
    if len(by_key) >= size:
        _evict(self, by_key)
    n = len(by_key)
    put_untracked(by_key, key, d)
    if len(by_key) > n:  # (a new key: the characters the caches hold of it)
        self._key_chars += len(key)
        if self._key_chars > self._max_key_chars:
            shed_keys(self)
    return key, d


#: the caches of message keys (and of what is made of them: unit keys, renderings) that
#: ``shed_keys`` thins out, and those it thins out whatever they hold (a value run's text and
#: its count: a stand-in's is a few characters long; a call id and its message's key)
_KEYED_CACHES = ("_by_key", "_looks", "_frame_parts", "_units", "_local_units", "_texts")
_ANY_CACHES = ("_pieces", "_calls")


@cython.ccall
def holds_message_key(k: Any) -> bool:
    """Whether the cache key ``k`` is a real message's key (it holds a NUL: a stand-in's is a
    JSON dict without one) or a tuple holding one, a level down (unit keys, a unit cache's
    ``(unit keys, pred, succ, caller)``, a rendering's ``(keys, None)``).

    >>> holds_message_key('{"role": "user", "content": null}\\0hi'), holds_message_key(('{"role": "user"}', "user"))
    (True, False)
    >>> holds_message_key(((".", '{}\\0x'), "first", "user", None))
    True
    """
    if type(k) is str:
        return "\0" in k
    if type(k) is tuple:
        for x in k:
            if type(x) is str:
                if "\0" in x:
                    return True
            elif type(x) is tuple:
                for y in x:
                    if type(y) is str and "\0" in y:
                        return True
    return False


@cython.ccall
def shed_keys(self: CounterCore) -> None:
    """Make room once the message keys ``self._by_key`` holds pass ``self._max_key_chars``
    characters (``ChatTemplateTokenCounter.MAX_KEY_CHARS``): drop the oldest quarter of what
    every cache of message keys holds of real messages (``_KEYED_CACHES``; ``holds_message_key``:
    the stand-ins the template's frames and plans are learned on stay), and the memo entries of
    messages that are gone; then count the characters again. An eval run's conversations end
    and are not seen again: without this their keys, template dicts, texts and costs stayed
    until each cache reached ``cache_size`` entries -- 1.6 kB a message of a customer-service
    trace, ~100 MB behind 4,000 conversations, more with a coding agent's outputs. A key
    dropped here and asked for again is computed again (its tokens counted once more)."""
    i: cython.Py_ssize_t
    with self._lock:
        for name in _KEYED_CACHES + _ANY_CACHES:
            cache: dict = getattr(self, name)
            drop: list = []
            want = len(cache) // 4
            every = name in _ANY_CACHES
            for k in cache:
                if len(drop) >= want:
                    break
                if every or holds_message_key(k):
                    drop.append(k)
            for i in range(len(drop)):
                cache.pop(drop[i], None)
        memo: dict = self._memo
        for mid in [mid for mid, e in memo.items() if e[0]() is None]:
            del memo[mid]
        total = 0
        for k in self._by_key:
            total += len(k)
        self._key_chars = total


@cython.ccall
def _evict(self: CounterCore, cache: dict, adding: int = 1) -> None:
    """Make room in ``cache`` (a cache at ``self.cache_size`` entries) for ``adding`` new keys:
    drop its oldest quarter -- at least one key, more where ``adding`` needs it -- under the
    counter's lock (another thread may be evicting too: each key is popped at most once).

    Every cache of the counter is evicted here and stored into without the lock: a dict
    store (or ``update``) is atomic, and what is stored under a key is a function of the key
    (two threads storing it agree)."""
    size = self.cache_size
    with self._lock:
        for old in list(cache)[: max(size // 4, len(cache) + adding - size, 1)]:
            cache.pop(old, None)


@cython.ccall
def store_all(self: CounterCore, cache: dict, new: Mapping[Any, Any]) -> None:
    """``cache.update(new)`` within ``self.cache_size`` keys: room made by ``_evict``; of a
    batch larger than the whole cache only its last ``cache_size`` entries are kept (a cache
    holds what it can; a reader finding a key gone computes it again). Its keys and values
    are ``settle``d first (key tuples, cost tuples), and ``new`` with them (an empty cache
    takes the tracking of the dict it is updated from): a cache holding only untracked ones
    stays untracked (see ``put_untracked``)."""
    settle(new)
    size = self.cache_size
    n = len(new)
    if n > size:
        new = dict(list(new.items())[n - size:])
        n = size
    if len(cache) + n > size:
        _evict(self, cache, n)
    cache.update(new)


@cython.ccall
def any_lookahead(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a message of ``dicts`` is one ``count_messages`` renders whole for (reasoning
    the template reads, a text feature in ``self._sensitive``: ``self._lookahead(d)`` but for
    call text counted under ``_final_rule``), cached per message key."""
    return looks_in(self, keys, dicts, 0)


@cython.ccall
def any_whole(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``count_messages`` renders a conversation holding ``dicts`` whole for one of
    them: ``any_lookahead``, but under ``_query_rule`` an assistant message's reasoning and
    ``</think>`` text are counted from segments (kept or stripped by where the last user
    message stands: ``segments``), and under ``_final_reasoning`` its reasoning (by where the
    last final answer stands), and do not count here."""
    if not (self._query_rule or self._final_reasoning):
        return any_lookahead(self, keys, dicts)
    return looks_in(self, keys, dicts, 2)


@cython.ccall
def holds_kept(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]]) -> bool:
    """Whether an assistant message of ``dicts`` has reasoning or ``</think>`` text that the
    template prints by where the last user message stands (``_query_rule``: such a unit after
    it is costed between stand-ins with no user message after it, ``segments``)."""
    return looks_in(self, keys, dicts, 1)


@cython.ccall
def looks_in(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]], mode: int) -> bool:
    """Whether a message of ``dicts`` has lookahead (its cached trait's flag): any (``mode``
    0, ``any_lookahead``), one ``_query_rule`` follows (1: an assistant's reasoning or
    ``</think>`` text, ``holds_kept``), or one it does not (2: another role's, a call's text the
    template looks ahead for; ``any_whole``)."""
    looks: dict = self._looks
    call_text = "call_text" in self._sensitive
    i: cython.Py_ssize_t
    for i in range(min(len(keys), len(dicts))):
        t = looks.get(keys[i])
        if t is None:
            t = trait(self, keys[i], dicts[i])
        if t[0]:
            if mode == 0:
                return True
            f = t[1]
            if mode == 1:
                if f[0] == "assistant" and (f[2] or f[4]):
                    return True
            elif f[0] != "assistant" or (call_text and f[3]):
                return True
    return False


@cython.ccall
def last_user(dicts: Sequence[Mapping[str, Any]], lo: int, hi: int) -> int:
    """The index of the last user message in ``dicts[lo:hi]``; -1 where there is none.

    >>> last_user([{"role": "user"}, {"role": "assistant"}, {"role": "tool"}], 0, 3)
    0
    """
    i: cython.Py_ssize_t
    for i in range(hi - 1, lo - 1, -1):
        if dicts[i]["role"] == "user":
            return i
    return -1


@cython.ccall
def plain_query(d: Mapping[str, Any]) -> bool:
    """Whether the user message ``d`` is a query as Qwen3's template finds the last one: its
    content a string not wrapped in ``<tool_response>`` tags (those are tool results a client
    sent as user messages).

    >>> plain_query({"role": "user", "content": "hi"}), plain_query({"role": "user", "content": "<tool_response>x</tool_response>"})
    (True, False)
    """
    c = d.get("content")
    if type(c) is not str:
        return False
    t: str = c  # (a str: its methods called in C)
    return not (t.startswith("<tool_response>") and t.endswith("</tool_response>"))


@cython.ccall
def trait_value(look: bool, role: Any, n_calls: int, reasoning: bool, call_text: bool,
                think_text: bool) -> tuple[bool, tuple[Any, ...]]:
    """``(look, (role, n_calls, reasoning, call_text, think_text))``, the one object of that
    value (``_TRAITS``: at most 256 of them; past that, a new tuple each time).

    >>> trait_value(False, "user", 0, False, False, False) is trait_value(False, "user", 0, False, False, False)
    True
    """
    table: dict = _TRAITS
    if not (look or n_calls or reasoning or call_text or think_text):  # (most messages: by role)
        t = table.get(role)
        if t is None:
            t = settle((False, (role, 0, False, False, False)))
            if len(table) < 256:
                table[role] = t
        return t
    k = (look, role, n_calls, reasoning, call_text, think_text)
    t = table.get(k)
    if t is None:
        t = settle((look, (role, n_calls, reasoning, call_text, think_text)))
        if len(table) < 256:
            table[k] = t
    return t


@cython.ccall
def trait(self: CounterCore, k: str, d: Mapping[str, Any]) -> tuple[bool, tuple[Any, ...]]:
    """``(any_lookahead's answer for d, d's element of self._pattern)``, cached per message key."""
    looks: dict = self._looks
    t = looks.get(k)
    if t is None:
        reasoning = _has_reasoning(d)
        call_text, think_text = _text_features(d)
        sensitive = self._sensitive
        look = (reasoning and ("reasoning" in sensitive or d["role"] != "assistant")) or bool(sensitive) and (
            (call_text and "call_text" in sensitive) or (think_text and "think_text" in sensitive))
        t = trait_value(look, d["role"], len(d.get("tool_calls") or ()), reasoning, call_text, think_text)
        if len(looks) >= self.cache_size:
            _evict(self, looks)
        looks[k] = t
    return t


@cython.ccall
def local_pattern(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]]) -> bool:
    """``self._is_local(dicts, keys)``: the unit's role pattern from the cached traits, its
    answer from ``self._local`` (probed by ``_is_local`` the first time)."""
    return _pattern_local(self, keys, dicts, False)


@cython.ccall
def unit_locality(self: CounterCore, keys: tuple, dicts: Sequence[Mapping[str, Any]]) -> tuple:
    """``(any_lookahead(self, keys, dicts), is_local(self, keys, dicts))`` for the unit ``keys``.
    Kept (in ``self._looks``, under the keys' tuple: reset with it) for a unit that is not local,
    whose costs ``upper_costs`` asks for after ``prefill_units`` asked this; a local unit's costs
    are cached whole (``_local_units``)."""
    looks: dict = self._looks
    got = looks.get(keys)
    if got is not None:
        return got  # type: ignore[no-any-return]
    if is_local(self, keys, dicts):
        return (False, True)
    got = settle((any_lookahead(self, keys, dicts), False))
    if len(looks) >= self.cache_size:
        _evict(self, looks)
    looks[settle(keys)] = got
    return got


@cython.ccall
def is_local(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]]) -> bool:
    """``not any_lookahead(self, keys, dicts) and self._is_local(dicts, keys)`` in one pass
    over the cached traits."""
    return _pattern_local(self, keys, dicts, True)


@cython.ccall
def _pattern_local(self: CounterCore, keys: Sequence[str], dicts: Sequence[Mapping[str, Any]], no_lookahead: bool) -> bool:
    """Whether the unit's role pattern (from the cached traits) is neighbour-independent, from
    ``self._local`` (probed by ``_is_local`` the first time); with ``no_lookahead``, False as
    soon as a message has lookahead (``is_local``), else lookahead is not asked
    (``local_pattern``)."""
    looks: dict = self._looks
    pat: list = []
    i: cython.Py_ssize_t
    for i in range(min(len(keys), len(dicts))):
        t = looks.get(keys[i])
        if t is None:
            t = trait(self, keys[i], dicts[i])
        if no_lookahead and t[0]:
            return False
        pat.append(t[1])
    local_of: dict = self._local
    local = local_of.get(tuple(pat))
    if local is None:
        return bool(self._is_local(dicts, keys))
    return bool(local)


def count_messages(self: CounterCore, messages: Iterable[Any]) -> int:
    """Exact tokens of ``messages`` as one request with the generation prompt, without tools
    (``count_messages([])`` is the template's fixed cost: what it renders around nothing).

    Counted from cached segments, or by rendering the whole template where additivity may
    fail (see the module docstring)."""
    ms = list(messages)  # (a copy: the caller may change its list before the next call)
    if not ms:
        return self._empty
    keys, dicts, ov = call_entries(self, ms)
    last = dicts[-1]["role"]
    if not self.additive or last not in ("user", "tool") or end_cost(self, last) is None:
        return self._full(keys, dicts)
    # the previous segmented call's messages had no lookahead: check only the others
    if ov is None:
        ov = overlap(self, keys)
    # (and a system message after the first, where the template joins system texts, and a tool
    # result outside its call's unit, where the template renders it by what came before)
    sensitive: frozenset = self._sensitive
    later_system = "later_system" in sensitive
    orphan_tool = "orphan_tool" in sensitive
    if ov is None:
        if any_whole(self, keys, dicts) or (later_system and any_system(dicts, 1)) or (
                orphan_tool and any_orphan(dicts, 0)):
            return self._full(keys, dicts)
    else:
        p, _, m = ov
        if (p and any_whole(self, keys[:p], dicts[:p])) or any_whole(self, keys[p + m:], dicts[p + m:]):
            return self._full(keys, dicts)
        if (later_system and any_system(dicts, max(p + m, 1))) or (orphan_tool and any_orphan(dicts, p + m)):
            return self._full(keys, dicts)
    try:
        return segments(self, ms, keys, dicts, ov)
    except Refused:
        # a unit refused between stand-ins (gpt-oss refuses a tool result whose call is not
        # the last assistant message before it, which the whole conversation may still
        # satisfy): the whole rendering decides, and raises the template's own refusal
        return self._full(keys, dicts)


@cython.ccall
def any_system(dicts: Sequence[Mapping[str, Any]], start: int) -> bool:
    """Whether a system message stands in ``dicts[start:]``.

    >>> any_system([{"role": "system"}, {"role": "user"}], 1)
    False
    """
    i: cython.Py_ssize_t
    for i in range(start, len(dicts)):
        if dicts[i]["role"] == "system":
            return True
    return False


@cython.ccall
def any_orphan(dicts: Sequence[Mapping[str, Any]], start: int) -> bool:
    """Whether a tool message in ``dicts[start:]`` stands in a unit that does not open with an
    assistant message making calls (the unit of ``dicts[start]`` is read from its start).

    >>> call = {"role": "assistant", "tool_calls": [{}]}
    >>> any_orphan([{"role": "user"}, call, {"role": "tool"}], 0), any_orphan([{"role": "user"}, {"role": "tool"}], 1)
    (False, True)
    """
    a: cython.Py_ssize_t = start
    i: cython.Py_ssize_t
    while 0 < a < len(dicts) and dicts[a]["role"] == "tool":
        a -= 1
    in_call = False
    for i in range(a, len(dicts)):
        d = dicts[i]
        if d["role"] == "tool":
            if not in_call:
                return True
        else:
            in_call = d["role"] == "assistant" and bool(d.get("tool_calls"))
    return False


@cython.ccall
def end_cost(self: CounterCore, role: str) -> Optional[int]:
    """``self._end_cost(role)``, its cached answer looked up here."""
    ends: dict = self._ends
    if role in ends:
        return ends[role]  # type: ignore[no-any-return]
    return self._end_cost(role)  # type: ignore[no-any-return]


@cython.ccall
def overlap(self: CounterCore, keys: list[str]) -> Optional[tuple[int, int, int]]:
    """``(p, q, m)`` with ``keys[p:p + m] == last[q:]`` for the previous segmented call's
    message keys ``last`` (all of them, ``m = len(last) - q``), ``q`` a unit start there,
    and ``keys[:p] == last[:p]`` when ``p == q``: the prompt extends the last one
    (``(0, 0, len(last))``), or the trimming moved its cut after a pinned first message
    (``p`` 1) or none (``p`` 0). None when neither holds."""
    last = self._last
    if last is None:
        return None
    lkeys, lstarts = last[0], last[1]
    k, n = len(lkeys), len(keys)
    if k <= n and keys[:k] == lkeys:
        return 0, 0, k
    j: cython.Py_ssize_t
    for p in ([1, 0] if n > 1 and k and keys[0] == lkeys[0] else [0]):
        # (lkeys.index(x, p), without its ValueError where x is not there -- a new
        # conversation's first call: the error's message printed a message key)
        x = keys[p]
        q = -1
        for j in range(p, k):
            y = lkeys[j]
            if y is x or y == x:
                q = j
                break
        if q < 0:
            continue
        m = k - q
        if m <= n - p and keys[p:p + m] == lkeys[q:]:
            u = bisect_ints(lstarts, q)
            if u < len(lstarts) and lstarts[u] == q and (p != q or keys[:p] == lkeys[:p]):
                return p, q, m
    return None


@cython.ccall
def new_starts(dicts: Sequence[Mapping[str, Any]], lo: int) -> list:
    """The unit starts of ``dicts`` from ``lo`` on (a start there, where ``segments`` knows the
    units before it): every message but a tool result.

    >>> new_starts([{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "user"}], 1)
    [1, 3]
    """
    out: list = []
    i: cython.Py_ssize_t
    for i in range(lo, len(dicts)):
        if dicts[i]["role"] != "tool":
            out.append(i)
    return out


@cython.ccall
def segments(self: CounterCore, ms: Sequence[Any], keys: list[str], dicts: list[dict[str, Any]],
              ov: Optional[tuple[int, int, int]] = None) -> int:
    n = len(ms)
    last = self._last
    if last is not None and ov is not None and ov[1] == 0 and ov[0] == 0 and ov[2]:
        # the prompt extends the last one: its unit starts, then the new messages'
        starts = last[1] + new_starts(dicts, ov[2])
    elif last is not None and ov is not None:
        # a moved cut: the first p (0 or 1) starts, the overlap's (shifted; q is one), the new
        p, q, m = ov
        lstarts: list = last[1]
        shift = q - p
        starts = lstarts[:p] + [s - shift for s in lstarts[bisect_ints(lstarts, q):]]
        starts += new_starts(dicts, p + m)
    else:
        starts = unit_starts(dicts)
    # units whose cost is known from the previous call: those of the overlap (``ov``, see
    # _overlap) but its last unit (what follows it may have changed) and, after a moved cut,
    # its first (what precedes it changed)
    # (their sum from the previous call's total, less the units it does not reuse: the few
    # a moved cut dropped, its last, and those a new final answer changes (below); not a sum
    # over the prompt's units per call)
    u: cython.Py_ssize_t
    head, reused, tail, total = len(starts), [], len(starts), 0
    # where the last final answer stands, for a template that looks ahead for one (its units
    # before it are costed with a final answer after them: one arriving among the new
    # messages changes what the overlap's units after the previous one cost, which are then
    # not reused)
    # (from the previous call's where the prompt holds its messages: only the others scanned)
    final = carried_last(last, ov, dicts, False) if self._final_rule else -1
    # where the last user message stands, for a template that prints an assistant's reasoning
    # only after it (``_query_rule``: the units after it that hold such reasoning are costed
    # with no user message after them; found as ``final`` is)
    query = -1
    if self._query_rule:
        query = carried_last(last, ov, dicts, True)
        if query >= 0 and not plain_query(dicts[query]) and holds_kept(self, keys, dicts):
            # (the template looks further back for its query: rendered whole)
            raise Refused("the last user message is not a plain query")
    if last is not None and ov is not None:
        p, q, m = ov
        lstarts, lcosts = last[1], last[2]
        uq = bisect_ints(lstarts, q) + (0 if p == q else 1)
        ul = len(lstarts) - 1
        if final >= p + m:
            # a final answer among the new messages: the overlap's units from the previous
            # one on (all, where there was none) now have one after them; those before it
            # already had, and keep their costs
            lf = bisect_ints(lstarts, last[4])
            if lf < ul:
                ul = lf
        if self._query_rule:
            # a unit (at ``s`` in the previous call) is kept after ``s > last[5]`` there, after
            # ``s - q + p > query`` here: those where the two differ cost again (a new user
            # message: the previous one's kept units are stripped now; a cut that drops the
            # only one: none is kept)
            t_old = last[5] if last[5] >= 0 else _NEVER
            t_new = query + q - p if query >= 0 else _NEVER
            if t_old != t_new:
                lf = bisect_ints(lstarts, t_old if t_old < t_new else t_new, True)
                if lf < ul:
                    ul = lf
        if uq < ul:
            head = bisect_ints(starts, lstarts[uq] - q + p)
            reused = lcosts[uq:ul]
            tail = head + len(reused)
            total = last[3]
            for u in range(uq):
                total -= lcosts[u]
            for u in range(ul, len(lstarts)):
                total -= lcosts[u]
    costs: list = []
    for u in range(head):
        c = unit_total(self, keys, dicts, starts, u, n, final, query)
        costs.append(c)
        total += c
    costs += reused
    for u in range(tail, len(starts)):
        c = unit_total(self, keys, dicts, starts, u, n, final, query)
        costs.append(c)
        total += c
    self._last = (keys, starts, costs, total, final, query)
    end = end_cost(self, dicts[-1]["role"])
    if end is None:
        raise Refused("no end cost")
    return end + total  # type: ignore[no-any-return]


@cython.ccall
def carried_last(last: Optional[tuple], ov: Optional[tuple], dicts: list, users: bool) -> int:
    """Where the last user message (``users``) or final answer of ``dicts`` stands (-1: none):
    from the previous segmented call's (``last[5]``, ``last[4]``) where the prompt holds its
    messages (``ov``, see ``overlap``), only the others scanned."""
    n = len(dicts)
    if last is None or ov is None:
        return last_user(dicts, 0, n) if users else last_final(dicts, 0, n)
    p, q, m = ov
    i = last_user(dicts, p + m, n) if users else last_final(dicts, p + m, n)
    if i >= 0:
        return i  # type: ignore[no-any-return]
    was = last[5] if users else last[4]
    if was >= q:
        return was - q + p  # type: ignore[no-any-return]
    return last_user(dicts, 0, p) if users else last_final(dicts, 0, p)  # type: ignore[no-any-return]


@cython.ccall
def last_final(dicts: Sequence[Mapping[str, Any]], lo: int, hi: int) -> int:
    """The index of the last final answer (an assistant message without calls) in
    ``dicts[lo:hi]``; -1 where there is none.

    >>> last_final([{"role": "assistant"}, {"role": "assistant", "tool_calls": [{}]}], 0, 2)
    0
    """
    i: cython.Py_ssize_t
    for i in range(hi - 1, lo - 1, -1):
        d = dicts[i]
        if d["role"] == "assistant" and "tool_calls" not in d:
            return i
    return -1


@cython.ccall
def unit_total(self: CounterCore, keys: list[str], dicts: list[dict[str, Any]], starts: list[int], u: int, n: int,
               final: int = -1, query: int = -1) -> int:
    """What unit ``u`` (of ``starts``) costs in the conversation ``keys``; ``final``: where the
    conversation's last final answer stands, for a template that looks ahead for one
    (``_final_rule``; -1: none, or not asked); ``query``: where its last user message stands,
    for a template that prints an assistant's reasoning only after it (``_query_rule``; -1:
    none, or not asked)."""
    a = starts[u]
    b = starts[u + 1] if u + 1 < len(starts) else n
    ukeys = tuple(keys[a:b])
    if 0 <= query < a and holds_kept(self, ukeys, dicts[a:b]):
        # after the last user message, its reasoning kept: costed with no user message after
        # it (stand-ins of its successor, then a call and its result; see _POST)
        if self._real_system_pred and dicts[a - 1]["role"] == "system":
            raise Refused("a unit with reasoning after a system message")
        # (the last unit as if a call followed it: the end's text is the end cost's, and the
        # unit keeps its cost when the next turn's call comes)
        succ = "assistant_kept" if b == n else dicts[b]["role"] + "_kept"
        pred = role_of(dicts[a - 1])
        unit = self._units.get((ukeys, pred, succ, None))
        if unit is None:
            unit = self._unit_cost(ukeys, pred, succ)
        return costs_sum(unit)
    # after a system message, where the template prints their texts with nothing between: the
    # real system message stands before the unit (whose first tokens may merge with its text)
    after_system = self._real_system_pred and a > 0 and dicts[a - 1]["role"] == "system"
    local_units: dict = self._local_units
    if not after_system:
        known = local_units.get(ukeys)
        if known is not None:
            return costs_sum(known)
    # its neighbours' roles (stand-ins of them are what it is costed between)
    if a == 0:
        pred = "first"
    else:
        pred = role_of(dicts[a - 1])
    succ = "end" if b == n else dicts[b]["role"]
    if self._final_rule and succ != "end":  # (after its last message no final answer follows)
        if succ == "assistant" and "tool_calls" in dicts[b]:
            succ = "call"
        if final > a and succ != "assistant":
            succ += "_final"
    caller = keys[a - 1] if after_system else None
    # costed between these neighbours already (the budget filter's charges hold each new unit's
    # exact pair): _unit_cost's cache, looked up here (unit_succ's successor), before asking
    # whether any neighbours would do
    unit = self._units.get((ukeys, pred, "user" if succ == "end" or (self._succ_blind and succ != "open") else succ,
                            caller))
    if unit is not None:
        return costs_sum(unit)
    if not after_system and local_pattern(self, ukeys, dicts[a:b]):  # any neighbours will do: share the cache entry
        unit = self._unit_cost(ukeys, self._canonical(dicts[a]["role"]), "user")
        # (not a unit whose cost here is one of several: reasoning stripped before the last user
        # message under _query_rule, kept after it -- the charges, which take the cache of local
        # units for the unit's one cost, charge it the most of those)
        if dicts[a]["role"] != "tool" and not any_lookahead(self, ukeys, dicts[a:b]):
            self._remember_local(ukeys, unit)
    else:
        unit = self._unit_cost(ukeys, pred, succ, caller)
    return costs_sum(unit)
