"""Cutting text on a counter's token boundaries: the head and tail of a text around a marker.

>>> from jianmu_fast.memory.context.counters import SimpleTokenCounter
>>> Cutter(SimpleTokenCounter()).cut("0123456789" * 8, 12, " [...{omitted}] ")
('01234567890123456789 [...11] 4567890123456789', 11)
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["Cutter"]


class Cutter:
    """Head and tail pieces of a text on the counter's token boundaries (never inside a
    UTF-8 character): tiktoken tokens for ``TiktokenTokenCounter``, the tokenizer's offsets
    for ``HFTokenCounter``, characters (by binary search on ``count_text``) otherwise."""

    _byte_level = False  # (a cutter pickled before ``within`` existed never skips a count)

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        enc = getattr(counter, "_enc", None)
        self._enc = enc if callable(getattr(enc, "encode_ordinary", None)) and callable(getattr(enc, "decode_bytes", None)) else None
        tok = getattr(counter, "_tok", None)
        self._tok = tok if self._enc is None and callable(getattr(tok, "encode", None)) else None
        ct = getattr(counter, "count_text", None)
        if not callable(ct):
            raise TypeError(f"counter {counter!r} has no count_text(text): the cut needs one to count text pieces")
        self.count_text = ct
        from ..counters import TiktokenTokenCounter

        #: the counter is byte-level BPE (tiktoken, exactly): a text counts at most its UTF-8 bytes
        self._byte_level = type(counter) is TiktokenTokenCounter and self._enc is not None

    def within(self, text: str, max_tokens: int) -> bool:
        """True when ``text`` certainly counts at most ``max_tokens`` without counting it: with
        a byte-level BPE counter every token is at least one byte of the text's UTF-8 (a lone
        surrogate is counted as U+FFFD, three bytes, as ``surrogatepass`` encodes it), so a
        text of at most ``max_tokens`` bytes fits; False means: count it.

        >>> from jianmu_fast.memory.context import SimpleTokenCounter, TiktokenTokenCounter
        >>> c = Cutter(TiktokenTokenCounter("o200k_base"))
        >>> c.within("héllo", 6), c.within("héllo", 5), Cutter(SimpleTokenCounter()).within("hi", 100)
        (True, False, False)
        """
        if not self._byte_level:
            return False
        n = len(text)
        if n * 4 <= max_tokens:  # (a character is at most four bytes)
            return True
        return n <= max_tokens and len(text.encode("utf-8", "surrogatepass")) <= max_tokens

    def pieces(self, text: str, head: int, tail: int) -> tuple[str, str]:
        """The longest prefix of ``text`` of at most ``head`` tokens and suffix of at most
        ``tail`` tokens (of the text's own tokenization), not overlapping."""
        head, tail = max(0, head), max(0, tail)
        if self._enc is not None:
            toks = self._enc.encode_ordinary(text)
            n = len(toks)
            tail = min(tail, n - min(head, n))
            # (a lone surrogate: tiktoken counts it as U+FFFD, three bytes, as surrogatepass
            # encodes it, so the token offsets fall on the same bytes)
            raw = text.encode("utf-8", "surrogatepass")
            h = len(self._enc.decode_bytes(toks[:head])) if head else 0
            while 0 < h < len(raw) and (raw[h] & 0xC0) == 0x80:
                h -= 1
            t = len(raw) - len(self._enc.decode_bytes(toks[n - tail:])) if tail else len(raw)
            while h < t < len(raw) and (raw[t] & 0xC0) == 0x80:
                t += 1
            t = max(t, h)
            return raw[:h].decode("utf-8", "surrogatepass"), raw[t:].decode("utf-8", "surrogatepass")
        if self._tok is not None:
            offsets = self._tok.encode(text, add_special_tokens=False).offsets
            n = len(offsets)
            head = min(head, n)
            tail = min(tail, n - head)
            h = offsets[head - 1][1] if head else 0
            t = offsets[n - tail][0] if tail else len(text)
            t = max(t, h)
            return text[:h], text[t:]
        h = self._longest(text, head, from_end=False)
        t = len(text) - self._longest(text[h:], tail, from_end=True)
        return text[:h], text[t:]

    def _longest(self, text: str, budget: int, from_end: bool) -> int:
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            piece = text[len(text) - mid:] if from_end else text[:mid]
            if self.count_text(piece) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def cut(self, text: str, max_tokens: int, marker: str) -> Optional[tuple[str, int]]:
        """``text`` cut to head + marker + tail within ``max_tokens`` (by ``count_text``), and
        the tokens left out; ``None`` when ``text`` fits already (without counting it when it
        certainly does: see ``within``)."""
        if self.within(text, max_tokens):
            return None
        n = self.count_text(text)
        if n <= max_tokens:
            return None
        budget = max_tokens - self.count_text(marker.format(omitted=n))
        for _ in range(16):
            if budget <= 0:
                break
            head, tail = self.pieces(text, (budget + 1) // 2, budget // 2)
            omitted = max(0, n - self.count_text(head) - self.count_text(tail))
            out = head + marker.format(omitted=omitted) + tail
            got = self.count_text(out)
            if got <= max_tokens:
                return out, omitted
            budget -= max(1, got - max_tokens)
        for out in (marker.format(omitted=n), "[...]", ""):
            if self.count_text(out) <= max_tokens:
                return out, n
        return "", n  # pragma: no cover - count_text("") is 0 for every counter
