"""Reading the input: lines of a JSONL stream (or rows of a ``.parquet`` file) in chunks, each
decoded and parsed as strict JSON into a conversation, or the reason it is not one."""

from __future__ import annotations

import argparse
import json
import re
from typing import IO, Any, Iterator, Optional

from .common import UsageError, finite_float, refuse_constant

__all__ = ["CHUNK", "CHUNK_WITH_BAR", "decode_line", "parse_line", "input_rows", "drop_nulls", "chunks"]

CHUNK = 4096  # lines per batch: bounds memory, and the output streams as it goes
CHUNK_WITH_BAR = 512  # smaller batches when a progress bar is shown, so that it moves


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # where a lone surrogate can come from
_BOM = b"\xef\xbb\xbf"


def decode_line(raw: bytes, lineno: int) -> str:
    """The text of one input line; ValueError naming the first byte that is not UTF-8."""
    if lineno == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} ({exc.reason})"
        ) from None


def _lone_surrogate(obj: Any, root: str = "") -> Optional[str]:
    """Where the first string (or key) of ``obj`` holding a lone surrogate is, with the
    character; None when there is none. Iterative, so any depth ``json.loads`` accepts works.

    >>> _lone_surrogate({"messages": [{"content": "ok"}, {"content": "a\\ud800"}]})
    'messages[1].content: a lone surrogate \\\\ud800'
    """
    stack: list[tuple[str, Any]] = [(root, obj)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{path or 'the line'}: a lone surrogate \\u{ord(item[exc.start]):04x}"
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                bad = _lone_surrogate(key)
                if bad is not None:
                    return f"{path or 'the line'}: a key with {bad.split(': ', 1)[1]}"
                stack.append((f"{path}.{key}" if path else key, item[key]))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None

def parse_line(text: str, fmt: str = "openai") -> tuple[dict[str, Any], Any]:
    """``(other keys, messages)`` of one line; raises ValueError with the reason. With
    ``fmt="anthropic"`` the line is an Anthropic request (``messages`` and ``system``)."""
    from ..message import coerce_messages

    try:
        obj = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        where = _lone_surrogate(obj, "messages" if isinstance(obj, list) else "")
        if where is not None:
            raise ValueError(f"{where} (half of a UTF-16 pair) is not valid Unicode and cannot be written as UTF-8")
    if isinstance(obj, list):
        rest: dict[str, Any] = {}
        raw = obj
    elif isinstance(obj, dict):
        if "messages" not in obj:
            raise ValueError("not a conversation: an object needs a 'messages' list")
        rest = dict(obj)
        raw = rest.pop("messages")
        if not isinstance(raw, list):
            raise ValueError(f"not a conversation: 'messages' must be a list, got {type(raw).__name__}")
    else:
        raise ValueError(f"not a conversation: expected an object or a list, got {type(obj).__name__}")
    if fmt == "anthropic":
        from ..integrations.anthropic import from_anthropic

        return rest, from_anthropic(raw, rest.pop("system", None))
    return rest, coerce_messages(raw, "messages")

def input_rows(args: argparse.Namespace, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The input's lines: a JSONL stream's, or for a ``.parquet`` INPUT each row as a JSON line
    (its number is the row's, from 1), read with pyarrow (``--engine local``) or Ray Data
    (``--engine ray``). Arrow gives every message struct all the fields of the column, unset
    ones null: those are left out of the messages, so a row reads as the JSONL line it came from."""
    if not args.input.endswith(".parquet"):
        return _lines(stream)
    return _parquet_rows(args.input, args.engine)


def _parquet_rows(path: str, engine: str) -> Iterator[tuple[int, bytes]]:
    if engine == "ray":
        import ray.data

        batches: Any = ray.data.read_parquet(path).iter_batches(batch_size=CHUNK, batch_format="pyarrow")
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError("a .parquet INPUT needs pyarrow: pip install 'jianmu_fast[ray]'") from None
        batches = pq.ParquetFile(path).iter_batches(batch_size=CHUNK)
    n = 0
    for batch in batches:
        for row in batch.to_pylist():
            n += 1
            if isinstance(row.get("messages"), list):
                row["messages"] = [drop_nulls(m) for m in row["messages"]]
            try:
                yield n, json.dumps(row, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError) as exc:  # a value JSON cannot hold (bytes, a date): this row's error
                yield n, f"\x00{type(exc).__name__}: {exc}".encode("utf-8", "replace")


def drop_nulls(value: Any) -> Any:
    """``value`` without ``None``-valued keys, recursively: what a message struct Arrow filled
    in with the column's other fields reads as (lists, tuples and numpy arrays of structs too).

    >>> drop_nulls([{"role": "user", "content": "hi", "tool_calls": None}])
    [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_nulls(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays of structs
        return drop_nulls(value.tolist())
    return value


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each non-blank line (lines end at ``\\n`` only)."""
    for lineno, raw in enumerate(stream, 1):
        if raw.strip():
            yield lineno, raw


def chunks(it: Iterator[tuple[int, bytes]], size: int) -> Iterator[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    for item in it:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
