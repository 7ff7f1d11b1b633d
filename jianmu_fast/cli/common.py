"""What the command's modules share: its name, its usage error, reading a file that a flag
names, strict JSON, and the text of a line's error."""

from __future__ import annotations

from typing import Any

__all__ = ["PROG", "UsageError", "read_text", "refuse_constant", "finite_float", "reason_of"]

PROG = "jianmu-fast"


class UsageError(Exception):
    """A bad command line or an unreadable input (exit status 2)."""

    __module__ = "jianmu_fast.cli"  # where users import it from (and where it always lived)


def read_text(path: str, flag: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"{flag} {path!r}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path!r}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None

def refuse_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name} (JSON has no NaN or Infinity; the line is refused, not changed)")


def finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not strict JSON: the number {text} is out of range (it would be written as "
                         "Infinity; the line is refused, not changed)")
    return value

def reason_of(exc: BaseException) -> str:
    """What a line's error says: our own ValueErrors bare, anything else with its type."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to process (RecursionError)"
    return str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
