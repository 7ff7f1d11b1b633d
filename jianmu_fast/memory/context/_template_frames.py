"""Render-free messages for ``ChatTemplateTokenCounter``: a template's text around verbatim fields.

A chat template usually prints a message's ``content`` (a string, or each content block's
``text``; and ``name``, ``tool_call_id``, and its tool calls' ``id``, function ``name`` and
``arguments``) as it is, between text that
depends only on the rest of the conversation. A *frame* is a conversation with those fields
of its real messages left out (their roles, other fields and the stand-ins around them
kept). A tool call's ``arguments`` dict is probed by a ``ProbeDict``: printed through
``tojson`` with its default options (what transformers' templates do); any other reading of
it (a truth test included) renders. A string field passed through
``strip``/``lstrip``/``rstrip`` (Llama 3.1's ``| trim``, Qwen3's ``reasoning_content.strip('\\n')``)
gives a probe of its own, a *derived* slot: the frame prints the method's result on the real
value there (and replays on it what the template tests of it). The frame is rendered twice, with
each field replaced by a *probe*: a ``str`` subclass that records every operation the template
performs on it -- truth tests, comparisons, ``in``, method calls (``strip``, ``split``,
``startswith``...), slicing, length, hashing, iteration, formatting -- and keeps concatenation
results under watch too. Two probe families that differ in every respect a template could
read (length, words, case, first and last characters; quotes, backslashes, newlines, ``<``,
``&`` and braces that ``tojson`` and escaping would change) must give renderings that are the
same text around the probes, each probe printed verbatim (its tag never appears otherwise,
so a probe printed through ``tojson``, ``escape``, ``lower``... is caught), and the same
record of operations, made only of truth tests and predicates (``==``, ``!=``, ``in``,
``startswith``, ``endswith`` with plain arguments). Then the frame is kept as text pieces
and field slots, and any conversation of that frame renders as the pieces joined around its
own field values -- once the recorded predicates, replayed on those values, give the
recorded answers (the template then takes the very same path). Anything else (a template
that splits, measures, escapes or serializes a field, strips a stripped one again, compares two
fields, or reads it any other way) renders that conversation, and a frame whose probes were
read that way is marked "render".

>>> f = Frames(lambda dicts: "".join(f"<{d['role']}>{d['content']}</>" for d in dicts))
>>> f.render([{"role": "user", "content": "hi"}]), f.render([{"role": "user", "content": "yo"}])
('<user>hi</>', '<user>yo</>')
>>> f.stats()  # the frame learned (two probe renderings), then both assembled
{'frames': 1, 'fast': 2, 'rendered': 0}
>>> g = Frames(lambda dicts: "".join(d["content"].split()[0] for d in dicts))  # reads the content
>>> g.render([{"role": "user", "content": " hi there"}]), g.stats()
('hi', {'frames': 1, 'fast': 0, 'rendered': 1})
>>> h = Frames(lambda dicts: "".join(f"[{d['content'].strip()}]" for d in dicts))  # strips it
>>> h.render([{"role": "user", "content": " hi\\n"}]), h.render([{"role": "user", "content": "yo"}]), h.stats()
('[hi]', '[yo]', {'frames': 1, 'fast': 2, 'rendered': 0})
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Iterable, Optional, Sequence

from ..._template_base import NOT_YET, Refused, dumps_parsed, freeze, json_inside
from ..._template_base import DERIVED as _DERIVED
from ..._template_base import derivation_id as _derivation_id
from ..._template_core_py import ops_hold, slot_value

__all__ = ["NOT_YET", "Frames", "Probe", "ProbeDict", "Refused", "dumps_parsed", "json_inside", "ops_hold", "tojson"]

#: truth tests and predicates whose answer, replayed on the real value, decides the same path
_PREDICATES = frozenset({"__bool__", "__eq__", "__ne__", "__contains__", "startswith", "endswith"})
#: str methods a probe passes through unrecorded: conversion to text keeps the probe itself
_PASS = frozenset({
    "__new__", "__init__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__class__",
    "__init_subclass__", "__subclasshook__", "__dir__", "__doc__", "__sizeof__", "__str__", "__repr__",
    "__format__", "__add__", "__radd__", "__getnewargs__", "__reduce__", "__reduce_ex__", "__getstate__",
})
_REJECT = ("reject",)


class Probe(str):
    """A string that records what a template does with it into ``log`` (``slot`` is its
    field's index; -1: a concatenation that holds a probe, on which any reading is recorded)."""

    _log: list
    _slot: int

    def __new__(cls, value: str, log: list, slot: int) -> "Probe":
        obj = str.__new__(cls, value)
        obj._log = log
        obj._slot = slot
        return obj

    def __str__(self) -> str:  # ``{{ x }}`` and ``x|string`` keep the probe under watch
        return self

    def __repr__(self) -> str:
        self._log.append(_REJECT)
        return str.__repr__(self)

    def __format__(self, spec: str) -> str:
        if spec:
            self._log.append(_REJECT)
            return str.__format__(str.__str__(self), spec)
        return self

    def __add__(self, other: Any) -> Any:
        res = str.__add__(str.__str__(self), other)
        return Probe(res, self._log, -1)

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return Probe(str.__add__(str(other) if type(other) is not str else other, str.__str__(self)), self._log, -1)

    def __bool__(self) -> bool:
        res = len(str.__str__(self)) > 0
        self._record("__bool__", (), res)
        return res

    def __hash__(self) -> int:
        self._log.append(_REJECT)
        return str.__hash__(self)

    def _record(self, name: str, args: tuple, res: Any) -> None:
        if self._slot < 0 or name not in _PREDICATES or not all(_plain(a) for a in args):
            self._log.append(_REJECT)
        else:
            self._log.append((self._slot, name, args, res))


def _plain(a: Any) -> bool:
    if type(a) is str:
        return True
    return type(a) is tuple and all(type(x) is str for x in a)


#: strip methods whose result on a field is a probe of its own: a *derived* slot (see
#: ``_tc.DERIVED``), whose value is the method's result on the real value
_STRIPS = frozenset({"strip", "lstrip", "rstrip"})
#: a derivation in a probe's log: ``(derived slot, _DERIVE, (field slot, name, chars), None)``
#: (taken out of the frame's ops, which are replayed)
_DERIVE = "~"


def _wrap(name: str) -> Callable[..., Any]:
    base = getattr(str, name)

    def method(self: Probe, *args: Any, **kwargs: Any) -> Any:
        if name in _STRIPS and not kwargs and (args in ((), (None,)) or (len(args) == 1 and type(args[0]) is str)) \
                and 0 <= self._slot < _DERIVED:
            # a field stripped (Llama 3.1's ``| trim``, Qwen3's ``reasoning_content.strip('\n')``):
            # the result is a new probe, of a derived slot, whose tag tells where it is printed
            chars = args[0] if args else None
            d = self._slot + _derivation_id(name, chars) * _DERIVED
            self._log.append((d, _DERIVE, (self._slot, name, chars), None))
            family = 0 if str.__str__(self) == _probe_values(self._slot)[0] else 1
            return Probe(_probe_values(d)[family], self._log, d)
        res = base(str.__str__(self), *args, **kwargs)
        if kwargs:
            self._log.append(_REJECT)
        else:
            self._record(name, args, res)
        return res

    method.__name__ = name
    return method


for _name in dir(str):
    if _name in _PASS or _name in Probe.__dict__ or not callable(getattr(str, _name)):
        continue
    setattr(Probe, _name, _wrap(_name))
# reflected operators str lacks, so that ``x % probe`` and the like are recorded too
for _name in ("__rmod__", "__rmul__"):
    setattr(Probe, _name, lambda self, other, _n=_name: (self._log.append(_REJECT), NotImplemented)[1])


class _Serializing(threading.local):
    depth = 0


_SERIALIZING = _Serializing()


#: ``tojson``'s outputs for the objects ``remember_json`` registered, by id: each entry holds
#: the object (no other object takes its id while it lives) and its outputs by options
_JSON_MEMO: dict[int, tuple[Any, dict[tuple[Any, ...], str]]] = {}
#: past this many registered objects the registry starts again (a counter registers its tools
#: once per tool list it sees)
_JSON_MEMO_SIZE = 1024


def remember_json(objs: Iterable[Any]) -> None:
    """Let ``tojson`` keep its outputs for ``objs``: objects nothing changes while they live (a
    ``ChatTemplateTokenCounter``'s parsed tools, which templates see through the immutable
    sandbox). Llama 3.1's template prints each tool with ``tojson(indent=4)``, which only the
    pure-Python encoder does (~50 us a tool): a render with the same tools prints them again.

    >>> tools = [{"type": "function", "function": {"name": "f"}}]
    >>> remember_json(tools)
    >>> tojson(tools, indent=1) == tojson(tools, indent=1) == json.dumps(tools, indent=1)
    True
    """
    if len(_JSON_MEMO) > _JSON_MEMO_SIZE:
        _JSON_MEMO.clear()
    for o in objs:
        _JSON_MEMO[id(o)] = (o, {})


def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter (``json.dumps`` with its arguments); a ``ProbeDict``
    inside ``x`` lets itself be serialized here (anywhere else, reading it is recorded). The
    output for an object ``remember_json`` registered is kept, per options."""
    memo = _JSON_MEMO.get(id(x))
    if memo is not None and memo[0] is x:
        opts = (ensure_ascii, indent, tuple(separators) if isinstance(separators, list) else separators, sort_keys)
        try:
            return memo[1][opts]
        except TypeError:  # (options that do not hash: printed each time)
            memo = None
        except KeyError:
            pass
    _SERIALIZING.depth += 1
    try:
        text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    finally:
        _SERIALIZING.depth -= 1
    if memo is not None:
        memo[1][opts] = text
    return text


def _reject_dict(name: str) -> Callable[..., Any]:
    base = getattr(dict, name)

    def method(self: "ProbeDict", *args: Any, **kwargs: Any) -> Any:
        if not (name == "items" and _SERIALIZING.depth and not args and not kwargs):
            self._log.append(_REJECT)
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class ProbeDict(dict):
    """A tool call's parsed ``arguments`` as a probe: printing it through ``tojson`` (default
    options) is accepted, a truth test is recorded (replayed as "not empty"; the two probe
    families answer it differently, see ``_args_values``), any other reading (keys, items,
    length, lookups, comparisons, ``str``) is recorded as a rejection."""

    _log: list
    _slot: int

    def __init__(self, value: dict, log: list, slot: int) -> None:
        dict.__init__(self, value)
        self._log = log
        self._slot = slot

    def __bool__(self) -> bool:
        res = dict.__len__(self) > 0
        self._log.append((self._slot, "__dictbool__", (), res))
        return res

    def __hash__(self) -> int:  # type: ignore[override]
        self._log.append(_REJECT)
        return id(self)


for _name in ("__len__", "__iter__", "__getitem__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
              "__ge__", "__repr__", "__str__", "__format__", "__reversed__", "__or__", "__ror__", "__reduce__",
              "__reduce_ex__", "get", "keys", "values", "items", "copy", "__sizeof__"):
    setattr(ProbeDict, _name, _reject_dict(_name))


def _args_values(slot: int) -> tuple[dict, dict]:
    """The two probe values of a tool call's arguments slot. The first: unsorted keys, nested
    values, non-ASCII and escaped characters (any ``tojson`` option but the defaults prints
    them differently), the field's tag once. The second is empty: its ``tojson`` differs from
    the first's from the second character on and in length (a template slicing or measuring
    the printed arguments gives two texts), and a truth test answers differently (a template
    branching on it renders)."""
    tag = f"QZJ{slot}VQ"
    a = {f"z{tag}": [" \n\"\u00e9<&", {"y": 1, "b": None}], "a": 2.5}
    return a, {}


def _probe_values(slot: int) -> tuple[str, str, str]:
    """The two probe values of field ``slot`` and its tag (case-insensitive, escape-proof)."""
    tag = f"QZJ{slot}VQ"
    a = f" \n\"'\\<&{{{tag}}}>\u00e9\u6570\t "
    b = f"{tag.lower()}Wb two three 4\\\"\n<b/>&;}}\u00fc"
    return a, b, tag


class Frames:
    """Renders conversations (lists of template dicts) by ``render_fn``, or from cached frames.

    ``render_fn(dicts) -> str`` renders a conversation (raising whatever the template raises).
    ``fields``: the top-level string fields a frame leaves out; with ``calls``, also each
    ``tool_calls`` entry's ``id`` and ``function`` ``name`` (strings) and ``arguments`` (a
    dict: its slot is printed only as ``tojson`` with default options prints it). ``cache_size`` bounds the frames; ``table``, a dict to keep them in
    (shared by renderers that render alike).
    """

    def __init__(self, render_fn: Callable[[list[dict[str, Any]]], str],
                 fields: Sequence[str] = ("content", "name", "tool_call_id"), cache_size: int = 4096,
                 table: Optional[dict[Any, Any]] = None, calls: bool = True) -> None:
        self._render_fn = render_fn
        self._fields = tuple(fields)
        self._calls = calls
        self.cache_size = cache_size
        # frame key -> (pieces, slots, ops) or None ("render"); ``table`` shares it between
        # the renderers of one template (and its variables) in a process
        self._frames: dict[Any, Any] = {} if table is None else table
        self._lock = threading.Lock()
        self._fast = 0
        self._rendered = 0

    def stats(self) -> dict[str, int]:
        """Frames known, conversations assembled without rendering, conversations rendered."""
        return {"frames": len(self._frames), "fast": self._fast, "rendered": self._rendered}

    def frame_of(self, d: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
        """``(frame part of d, its field values)``: the fields holding a ``str`` left out (and
        a tool call's id, name and arguments; an arguments slot's value is its ``tojson``)."""
        values: list[str] = []
        if "tool_calls" not in d and not isinstance(d.get("content"), list):  # the common message
            fields = self._fields
            shape = []
            for k, v in d.items():
                if type(v) is str and v and k in fields:
                    values.append(v)
                    shape.append((k, None))
                else:
                    shape.append((k, _freeze(v)))
            return tuple(shape), tuple(values)
        shape_, _ = self._walk(d, values, [], None)
        return shape_, tuple(values)

    def _walk(self, d: dict[str, Any], values: list[str], kinds: list[int],
              probe: Optional[Callable[[int, int], Any]]) -> tuple[Any, Optional[dict[str, Any]]]:
        """``(shape, probed copy of d)``: slots appended to ``values`` (their kinds to ``kinds``:
        0 a string, 1 a tool call's arguments dict); the copy (only with ``probe(kind, slot)``)
        holds the probes."""
        shape: list[tuple[Any, Any]] = []
        new: Optional[dict[str, Any]] = {} if probe is not None else None
        for k, v in d.items():
            if type(v) is str and v and k in self._fields:
                w: Any = self._slot(v, 0, values, kinds, probe)
                shape.append((k, None))
            elif k == "content" and isinstance(v, list) and k in self._fields:
                bshape, w = self._blocks(v, values, kinds, probe)
                shape.append((k, ("B", bshape)))
            elif k == "tool_calls" and type(v) is list and self._calls:
                calls: list[Any] = []
                w = [] if probe is not None else None
                for call in v:
                    if type(call) is not dict:
                        calls.append(_freeze(call))
                        if w is not None:
                            w.append(call)
                        continue
                    cshape: list[tuple[Any, Any]] = []
                    c: Optional[dict[str, Any]] = {} if probe is not None else None
                    for ck, cv in call.items():
                        if ck == "id" and type(cv) is str and cv:
                            cw: Any = self._slot(cv, 0, values, kinds, probe)
                            cshape.append((ck, None))
                        elif ck == "function" and type(cv) is dict:
                            fshape: list[tuple[Any, Any]] = []
                            cw = {} if probe is not None else None
                            for fk, fv in cv.items():
                                if fk == "name" and type(fv) is str and fv:
                                    fw: Any = self._slot(fv, 0, values, kinds, probe)
                                    fshape.append((fk, None))
                                elif fk == "arguments" and type(fv) is dict:
                                    fw = self._slot(fv, 1, values, kinds, probe)
                                    fshape.append((fk, ("A",)))
                                else:
                                    fw = fv
                                    fshape.append((fk, _freeze(fv)))
                                if cw is not None:
                                    cw[fk] = fw
                            cshape.append((ck, ("F", tuple(fshape), None)))
                        else:
                            cw = cv
                            cshape.append((ck, _freeze(cv)))
                        if c is not None:
                            c[ck] = cw
                    calls.append(tuple(cshape))
                    if w is not None:
                        w.append(c)
                shape.append((k, ("C", tuple(calls), None)))
            else:
                w = v
                shape.append((k, _freeze(v)))
            if new is not None:
                new[k] = w
        return tuple(shape), new

    def _blocks(self, blocks: list, values: list[str], kinds: list[int],
                probe: Optional[Callable[[int, int], Any]]) -> tuple[Any, Optional[list]]:
        """``(shape, probed copy)`` of a content block list: each block's non-empty ``text``
        string a slot, everything else part of the shape."""
        shapes: list[Any] = []
        copy: Optional[list] = [] if probe is not None else None
        for b in blocks:
            if not isinstance(b, dict):
                shapes.append(_freeze(b))
                if copy is not None:
                    copy.append(b)
                continue
            bshape: list[tuple[Any, Any]] = []
            c: Optional[dict[str, Any]] = {} if probe is not None else None
            for bk, bv in b.items():
                if bk == "text" and type(bv) is str and bv:
                    bw: Any = self._slot(bv, 0, values, kinds, probe)
                    bshape.append((bk, None))
                else:
                    bw = bv
                    bshape.append((bk, _freeze(bv)))
                if c is not None:
                    c[bk] = bw
            shapes.append(("b", tuple(bshape)))
            if copy is not None:
                copy.append(c)
        return tuple(shapes), copy

    @staticmethod
    def _slot(v: Any, kind: int, values: list[str], kinds: list[int],
              probe: Optional[Callable[[int, int], Any]]) -> Any:
        slot = len(values)
        values.append(v if kind == 0 else _DUMPS(v))
        kinds.append(kind)
        return probe(kind, slot) if probe is not None else None

    def render(self, dicts: list[dict[str, Any]], parts: Optional[Sequence[Any]] = None) -> str:
        """``render_fn(dicts)``, assembled from the frame of ``dicts`` where that is exact.
        ``parts``: per dict, ``frame_of(d)``, or ``(anything hashable, ())`` for a dict whose
        fields are fixed (not probed: stand-ins); default ``frame_of`` of every dict."""
        if parts is None:
            parts = [self.frame_of(d) for d in dicts]
        values: list[str] = []
        for _, v in parts:
            values.extend(v)
        if not values:
            self._rendered += 1
            return self._render_fn(dicts)
        try:
            key: Any = tuple(shape for shape, _ in parts)
            entry = self._frames.get(key, False)
        except TypeError:  # a field value that cannot be a key: render
            self._rendered += 1
            return self._render_fn(dicts)
        if entry is False:
            entry = self._learn(dicts, [bool(v) for _, v in parts])
            with self._lock:
                if len(self._frames) >= self.cache_size:
                    for old in list(self._frames)[: max(1, self.cache_size // 4)]:
                        self._frames.pop(old, None)
                self._frames[key] = entry
        if entry is not None:
            pieces, slots, ops = entry
            if ops_hold(ops, values):
                self._fast += 1
                return _assemble(pieces, slots, values)
        self._rendered += 1
        return self._render_fn(dicts)

    def _learn(self, dicts: list[dict[str, Any]], probe: list[bool]) -> Any:
        """``(pieces, slots, ops)`` of the frame of ``dicts`` (fields probed in the dicts
        ``probe`` marks), or ``None`` (render it)."""
        runs = []
        kinds: list[int] = []
        for family in (0, 1):
            log: list = []
            probed = []
            kinds = []
            values: list[str] = []

            def make(kind: int, slot: int, log: list = log, family: int = family) -> Any:
                if kind == 0:
                    return Probe(_probe_values(slot)[family], log, slot)
                return ProbeDict(_args_values(slot)[family], log, slot)

            for d, yes in zip(dicts, probe):
                if not yes:
                    probed.append(d)
                    continue
                _, p = self._walk(d, values, kinds, make)
                probed.append(p if p is not None else d)
            n_slots = len(kinds)
            try:
                text = str.__str__(self._render_fn(probed))
            except Exception:
                return None  # the real conversation's own outcome comes from rendering it
            if _REJECT in log:
                return None
            runs.append((text, log))
        (text_a, ops_a), (text_b, ops_b) = runs
        if ops_a != ops_b:
            return None
        # the derived slots (a field stripped: see _STRIPS), and the ops replayed
        derived = sorted({op[0] for op in ops_a if op[1] == _DERIVE})
        ops_a = [op for op in ops_a if op[1] != _DERIVE]
        # each probe appears verbatim (slot s) or as the inside of its JSON string (slot
        # -1 - s: what ``tojson`` prints for a field, ensure_ascii off, as transformers' does)
        forms = {}
        for s in range(n_slots):
            if kinds[s] == 1:
                forms[json.dumps(_args_values(s)[0], ensure_ascii=False)] = s
                continue
            a = _probe_values(s)[0]
            forms[a] = s
            forms[_json_inside(a)] = -1 - s
        for s in derived:
            a = _probe_values(s)[0]
            forms[a] = s
            forms[_json_inside(a)] = -1 - s
        lower_a = text_a.lower()
        pattern = re.compile("|".join(re.escape(v) for v in sorted(forms, key=len, reverse=True)))
        pieces: list[str] = []
        slots: list[int] = []
        pos = 0
        for m in pattern.finditer(text_a):
            pieces.append(text_a[pos:m.start()])
            slots.append(forms[m.group()])
            pos = m.end()
        pieces.append(text_a[pos:])
        for s in [*range(n_slots), *derived]:  # every appearance of a probe's tag is one of those
            if lower_a.count(_probe_values(s)[2].lower()) != slots.count(s) + slots.count(-1 - s):
                return None
        values_b = {s: _probe_values(s)[1] if kinds[s] == 0 else json.dumps(_args_values(s)[1], ensure_ascii=False)
                    for s in range(n_slots)}
        values_b.update((s, _probe_values(s)[1]) for s in derived)
        text = [pieces[0]]
        for slot, piece in zip(slots, pieces[1:]):
            text.append(values_b[slot] if slot >= 0 else _json_inside(values_b[-1 - slot]))
            text.append(piece)
        if "".join(text) != text_b:  # the text around the probes is theirs alone
            return None
        return pieces, slots, ops_a


_json_inside = json_inside
#: ``json.dumps(x, ensure_ascii=False)`` without building an encoder per call
_DUMPS = json.JSONEncoder(ensure_ascii=False).encode


def _assemble(pieces: list[str], slots: list[int], values: Sequence[str]) -> str:
    out = [pieces[0]]
    for slot, piece in zip(slots, pieces[1:]):
        out.append(slot_value(values, slot) if slot >= 0 else _json_inside(slot_value(values, -1 - slot)))
        out.append(piece)
    return "".join(out)


_freeze = freeze
