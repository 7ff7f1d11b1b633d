"""count_text equals the raw tokenizer on a few thousand real-looking texts, cold and warm,
one by one and batched through count_array."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from jianmu_fast.memory.context import HFTokenCounter, TiktokenTokenCounter
from jianmu_fast.memory.context._encodings import load_tiktoken_encoding
from jianmu_fast.message import human

MINILM = Path(__file__).parent / "data" / "all-MiniLM-L6-v2.tokenizer.json"
N_TEXTS = 3000

_EN = ("the of and to in is that for it with as was on be by this are from token prompt cache budget "
       "message tool call result history window filter context model request latency error").split()
_ZH = "我们需要检查这个函数的返回值以及缓存命中率。工具调用的结果显示数据库连接超时，请稍后重试。上下文窗口预算已经超出限制。"
_EMOJI = ["🙂", "🚀", "👍🏽", "👩‍💻", "🇨🇳", "❤️", "🧑‍🤝‍🧑", "⚠️", "🌧️", "１２３", "ｅｍｏｊｉ"]
_SPECIAL = ["<|endoftext|>", "<|endofprompt|>", "<|fim_prefix|>", "<|fim_middle|>", "<|im_start|>",
            "<|im_end|>", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>", "<|start|>assistant<|message|>"]


def _json_result(rng: random.Random) -> str:
    rows = [{"id": rng.randint(1, 10**9), "name": rng.choice(_EN) + "_" + str(rng.randint(0, 99)),
             "price": round(rng.random() * 1000, rng.randint(0, 4)), "tags": rng.sample(_EN, 3),
             "note": rng.choice(["", _ZH[: rng.randint(1, 40)], rng.choice(_EMOJI)]),
             "ok": rng.choice([True, False, None])} for _ in range(rng.randint(1, 12))]
    return json.dumps({"status": "ok", "rows": rows}, ensure_ascii=rng.random() < 0.3,
                      indent=rng.choice([None, None, 2]))


def _code(rng: random.Random) -> str:
    name = rng.choice(_EN)
    lines = [f"def {name}_{rng.randint(0, 99)}(messages: list[dict], limit: int = {rng.randint(1, 9) * 512}) -> int:",
             f'    """Return the {name} of {rng.choice(_EN)}."""',
             "    total = 0",
             "    for i, m in enumerate(messages):",
             f"        total += len(m.get('content') or '')  # {rng.choice(_EN)}",
             "        if total > limit:\n            raise ValueError(f\"over: {total} > {limit}\")",
             "\treturn total\r\n", "    " * rng.randint(0, 6) + "pass"]
    rng.shuffle(lines)
    return "\n".join(lines[: rng.randint(1, len(lines))])


def _prose(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 25)):
        r = rng.random()
        if r < 0.5:
            parts.append(rng.choice(_EN))
        elif r < 0.7:
            a = rng.randrange(len(_ZH))
            parts.append(_ZH[a:a + rng.randint(1, 20)])
        elif r < 0.8:
            parts.append(rng.choice(_EMOJI) * rng.randint(1, 3))
        elif r < 0.9:
            parts.append(rng.choice(_SPECIAL))
        else:
            parts.append(rng.choice(["\n", "\n\n", "   ", "\t", "...", "!!", "1234567", "3.14159", "https://x.org/a?b=1"]))
    return rng.choice([" ", "", "\n"]).join(parts)


def _odd(rng: random.Random) -> str:
    return rng.choice([
        "", " ", "\n" * rng.randint(1, 40), " " * rng.randint(1, 300), "a" * rng.randint(1, 3000),
        "0" * rng.randint(1, 500), "🙂" * rng.randint(1, 200), "".join(_SPECIAL),
        "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 200))),
    ])


def corpus(seed: int = 20261130, n: int = N_TEXTS) -> list[str]:
    rng = random.Random(seed)
    makers = [_json_result, _code, _prose, _prose, _odd]
    return [rng.choice(makers)(rng) for _ in range(n)]


TEXTS = corpus()


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_tiktoken_count_text_is_exact(name):
    enc = load_tiktoken_encoding(name)
    want = [len(enc.encode_ordinary(t)) for t in TEXTS]
    c = TiktokenTokenCounter(name)
    assert [c.count_text(t) for t in TEXTS] == want  # cold, one by one
    assert [c.count_text(t) for t in TEXTS] == want  # warm
    batched = TiktokenTokenCounter(name, cache_size=500)  # batched misses, with evictions
    role = 3 + len(enc.encode_ordinary("user"))
    msgs = [human(t) for t in TEXTS]
    assert (batched.count_array(msgs) - role).tolist() == want
    assert (batched.count_array(msgs) - role).tolist() == want


def test_tiktoken_lone_surrogates_are_counted_like_tiktoken():
    enc = load_tiktoken_encoding("o200k_base")
    texts = ["abc\ud800def", "\udfff", "ok"]
    c = TiktokenTokenCounter("o200k_base")
    assert c.count_array([human(t) for t in texts]).tolist() == [4 + len(enc.encode_ordinary(t)) for t in texts]


@pytest.mark.parametrize("name, text, ids", [("o200k_base", "hello world", [24912, 2375]),
                                             ("cl100k_base", "hello world", [15339, 1917])])
def test_shipped_encodings_are_tiktokens(name, text, ids):
    """Ids published for these encodings; the vocabulary sizes tiktoken reports."""
    enc = load_tiktoken_encoding(name)
    assert enc.encode_ordinary(text) == ids
    assert enc.n_vocab == {"o200k_base": 200019, "cl100k_base": 100277}[name]


def test_hf_count_text_is_exact():
    raw = Tokenizer.from_file(str(MINILM))
    raw.no_truncation()
    raw.no_padding()
    want = [len(raw.encode(t, add_special_tokens=False).ids) for t in TEXTS]
    c = HFTokenCounter(MINILM)
    assert [c.count_text(t) for t in TEXTS] == want
    batched = HFTokenCounter(MINILM, cache_size=500)
    role = 4 + len(raw.encode("user", add_special_tokens=False).ids)
    msgs = [human(t) for t in TEXTS]
    assert (batched.count_array(msgs) - role).tolist() == want
    assert [c.count_text(t) for t in TEXTS] == want
