"""Token counters: ``SimpleTokenCounter`` (no dependencies), and the exact ones,
``TiktokenTokenCounter`` (OpenAI encodings, offline for cl100k_base and o200k_base) and
``HFTokenCounter`` (any HuggingFace fast tokenizer).

Every counter has ``count_text``, ``count_message``, ``count_messages``, ``count_array``
(one int64 count per message, what the compiled core consumes) and ``count_tools``.
``count_messages(ms) == count_messages([]) + sum(count_message(m) for m in ms)``, which is
what lets ``TokenBudgetFilter`` guarantee its budget.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Sequence

import numpy as np

from ...message import Message
from . import _encodings
from ._count_cache import DEFAULT_CACHE_SIZE, CachedChatCounter
from ._tools_count import json_tools_tokens, openai_tools_tokens

__all__ = ["SimpleTokenCounter", "TiktokenTokenCounter", "HFTokenCounter"]


class SimpleTokenCounter:
    """Estimate tokens as characters divided by ``chars_per_token`` (default 4), rounded up.

    The formula, per message::

        count_message(m) = 4                                   # role and message framing
                         + ceil(len(text) / cpt)               # str content, or each text block
                         + 85 per non-text content block       # images, audio, files
                         + ceil(len(name) / cpt) + 1           # if name is set
                         + ceil(len(tool_call_id) / cpt)       # if tool_call_id is set
                         + for each tool call: 3 + ceil(len(id) / cpt)
                               + ceil(len(function.name) / cpt) + ceil(len(function.arguments) / cpt)
        count_messages(ms) = 3 + sum(count_message(m))         # 3: the reply's priming

    >>> c = SimpleTokenCounter()
    >>> c.count_text("What is 2+2?")
    3
    >>> from jianmu_fast.message import human
    >>> c.count_message(human("What is 2+2?")), c.count_messages([human("What is 2+2?")])
    (7, 10)
    """

    PER_MESSAGE = 4
    PER_NAME = 1
    PER_TOOL_CALL = 3
    PER_REQUEST = 3
    PER_NON_TEXT_BLOCK = 85
    PER_TOOL = 8

    def __init__(self, chars_per_token: float = 4) -> None:
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, (int, float)):
            raise TypeError(f"chars_per_token must be a number, got {type(chars_per_token).__name__}")
        if not chars_per_token > 0 or math.isinf(chars_per_token):
            raise ValueError(f"chars_per_token must be a positive finite number, got {chars_per_token}")
        self.chars_per_token = chars_per_token

    def __repr__(self) -> str:
        return f"SimpleTokenCounter(chars_per_token={self.chars_per_token!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is SimpleTokenCounter and other.chars_per_token == self.chars_per_token

    def __hash__(self) -> int:
        return hash((SimpleTokenCounter, self.chars_per_token))

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``; 0 for the empty string."""
        cpt = self.chars_per_token
        if type(cpt) is int:
            return -(-len(text) // cpt)
        return math.ceil(len(text) / cpt)

    def count_message(self, message: Message) -> int:
        """Tokens of one message, by the formula in the class docstring."""
        ct = self.count_text
        total = self.PER_MESSAGE
        content = message.content
        if isinstance(content, str):
            total += ct(content)
        elif content:
            for block in content:
                if block.get("type") == "text":
                    total += ct(block["text"])
                else:
                    total += self.PER_NON_TEXT_BLOCK
        if message.name:
            total += ct(message.name) + self.PER_NAME
        if message.tool_call_id:
            total += ct(message.tool_call_id)
        if message.tool_calls:
            for call in message.tool_calls:
                fn = call["function"]
                total += (
                    self.PER_TOOL_CALL
                    + ct(call.get("id") or "")
                    + ct(fn["name"])
                    + ct(fn.get("arguments") or "")
                )
        return total

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: ``3 + sum(count_message(m))``."""
        return self.PER_REQUEST + sum(self.count_message(m) for m in messages)

    def count_array(self, messages: Sequence[Message]) -> np.ndarray:
        """One int64 count per message."""
        return np.fromiter((self.count_message(m) for m in messages), dtype=np.int64, count=len(messages))

    def count_tools(self, tools_schema: Sequence[dict[str, Any]] | None) -> int:
        """Tokens of a request's ``tools`` list: 8 per tool plus its compact JSON text."""
        if not tools_schema:
            return 0
        return sum(
            self.PER_TOOL + self.count_text(json.dumps(t, separators=(",", ":"), sort_keys=True))
            for t in tools_schema
        )


class TiktokenTokenCounter(CachedChatCounter):
    """Exact counts with a tiktoken encoding plus OpenAI's chat-format overhead.

    ``encoding`` is an encoding name (``"o200k_base"``, ``"cl100k_base"``, any other tiktoken
    knows), a model name (``"gpt-4o"``, ``"gpt-4"``; tiktoken's own table) or a
    ``tiktoken.Encoding``. cl100k_base and o200k_base ship with jianmu_fast and load with no
    network (sha256-checked against tiktoken's pins); other encodings load through tiktoken.

    ``count_text(t) == len(encoding.encode_ordinary(t))``: special-token text such as
    ``"<|endoftext|>"`` in user content is ordinary text, never an error. The formula is the
    cookbook's for chat models ("How to count tokens with tiktoken": 129 tokens on its example
    with cl100k_base, 124 with o200k_base, both matching the API and reproduced in our tests),
    extended to content blocks and tool calls (``count_tools`` covers the request's tools)::

        count_message(m) = 3 + tokens(role)                    # <|start|>role ... <|end|>
                         + tokens(content)                     # str, or each text block
                         + image_tokens per non-text block     # default 85: one low-detail image
                         + tokens(name) + 1                    # if name is set
                         + per tool call: 1 + tokens(function.name) + tokens(function.arguments)
        count_messages(ms) = 3 + sum(count_message(m))         # 3: <|start|>assistant<|message|>

    ``tool_call_id`` and call ids are not counted, and a call costs 1 token beyond its name
    and arguments: so calibrated, the formula reproduces a request measured against the API
    (an assistant tool call plus its result: 35 prompt tokens on gpt-4; counting the 18-token
    id would give 53), see tests. OpenAI does not publish how several parallel calls in one
    message are rendered, so those counts are the formula's, not a measurement. A high-detail image
    costs more than 85 tokens (765 for 1024x1024 on gpt-4o): raise ``image_tokens`` if you
    send those. Counts are cached (``cache_size`` distinct texts and messages, see
    ``_count_cache``); the counter is thread-safe and pickles by encoding name (and engine).

    ``engine`` picks the tokenizer behind cache misses; counts are identical (property tests):

    - ``"tiktoken"``: tiktoken, the reference;
    - ``"fastokens"`` (``pip install 'jianmu_fast[fast]'``, cl100k_base and o200k_base only):
      4-8x faster on unseen text, but built once per process (~1.7 s of CPU; ~230 MiB);
    - ``"auto"`` (default): tiktoken until this counter has been asked to tokenize
      ``AUTO_FASTOKENS_CHARS`` (50 million) characters, then fastokens if it is installed
      (silently tiktoken otherwise). Measured end to end with ``jianmu-fast build --preset
      react --max-tokens 8000`` on a 2-core EPYC (CPU seconds, tiktoken vs fastokens engine,
      startup included): 0.46 M characters 0.66 vs 2.33; 4.5 M 1.11 vs 2.98; 13 M (coding
      traces) 2.03 vs 3.33; 15 M 2.23 vs 3.92; 39 M (coding) 4.97 vs 4.99; 44 M 7.36 vs 7.75.
      The CLI's inputs break even at ~40-55 M characters, so switching there costs at most
      about what tiktoken already spent (the ski-rental bound) and saves ~0.045 µs a
      character on everything after.

    >>> c = TiktokenTokenCounter("gpt-4o")
    >>> c.encoding_name, c.count_text("hello world"), c.count_text("<|endoftext|>")
    ('o200k_base', 2, 7)
    >>> from jianmu_fast.message import human
    >>> c.count_message(human("hello world")), c.count_messages([human("hello world")])
    (6, 9)
    """

    PER_MESSAGE = 3
    PER_NAME = 1
    PER_TOOL_CALL = 1
    PER_REQUEST = 3
    COUNT_TOOL_CALL_ID = False
    #: ``engine="auto"`` moves to fastokens once the counter was asked for this many characters
    AUTO_FASTOKENS_CHARS = 50_000_000

    def __init__(
        self, encoding: Any = "o200k_base", *, cache_size: int = DEFAULT_CACHE_SIZE, image_tokens: int = 85,
        engine: str = "auto",
    ) -> None:
        if engine not in ("auto", "tiktoken", "fastokens"):
            raise ValueError(f"engine: expected 'auto', 'tiktoken' or 'fastokens', got {engine!r}")
        self._init_cache(cache_size, image_tokens)
        if isinstance(encoding, str):
            if not encoding:
                raise ValueError("encoding: expected an encoding or model name, got ''")
            name = _encodings.resolve_encoding_name(encoding)
            self._enc = _encodings.load_tiktoken_encoding(name)
            self._by_name = True
        else:
            import tiktoken

            if not isinstance(encoding, tiktoken.Encoding):
                raise TypeError(
                    "encoding: expected an encoding name, a model name or a tiktoken.Encoding, "
                    f"got {type(encoding).__name__}"
                )
            self._enc = encoding
            self._by_name = False
        self.encoding_name: str = self._enc.name
        self.engine: str = engine
        self._fast: Any = None  # the fastokens.Tokenizer, built on first need
        # characters asked for so far (engine="auto"); -1: tiktoken, decided
        self._auto_chars = -1 if engine == "tiktoken" else 0
        core = getattr(self._enc, "_core_bpe", None)
        # tiktoken's Rust core, called directly (its wrapper only adds the lone-surrogate repair)
        self._core_encode: Any = getattr(core, "encode_ordinary", None)
        if engine != "fastokens" and type(self)._encode_counts is TiktokenTokenCounter._encode_counts:
            # the compiled counting loop calls it directly; for "auto" it first adds the
            # characters to _auto_chars, and leaves the call that reaches the threshold to
            # _encode_counts (the rule below), which drops the direct path if fastokens engages
            self._direct_encode = self._core_encode
        if engine == "fastokens":
            _encodings.import_fastokens()
            if not self._fastokens_exact():
                raise ValueError(
                    f"engine='fastokens' is proven exact for the shipped {', '.join(_encodings.SHIPPED_ENCODINGS)} "
                    f"only, not for this {self.encoding_name!r} encoding; use engine='tiktoken'"
                )

    def __repr__(self) -> str:
        if self.engine != "auto":
            return f"TiktokenTokenCounter({self.encoding_name!r}, engine={self.engine!r})"
        return f"TiktokenTokenCounter({self.encoding_name!r})"

    # -- engines ----------------------------------------------------------------------------

    @property
    def engine_in_use(self) -> str:
        """``"fastokens"`` once this counter tokenizes with fastokens, else ``"tiktoken"``.

        >>> TiktokenTokenCounter("o200k_base").engine_in_use
        'tiktoken'
        """
        return "tiktoken" if self._fast is None else "fastokens"

    def _fastokens_exact(self) -> bool:
        """Whether this counter's encoding is a shipped one (fastokens is proven equal on those)."""
        name = self.encoding_name
        if name not in _encodings.SHIPPED_ENCODINGS:
            return False
        return (self._by_name or _encodings.is_loaded(self._enc)
                or _encodings.same_encoding(self._enc, _encodings.load_tiktoken_encoding(name)))

    def _engage_fastokens(self, texts: list[str]) -> Any:
        """The fastokens tokenizer to use for ``texts``, or None for tiktoken (see ``engine``)."""
        if self.engine == "fastokens":
            self._fast = _encodings.load_fastokens(self.encoding_name)
            return self._fast
        if self._auto_chars < 0:
            return None
        self._auto_chars += sum(map(len, texts))
        if self._auto_chars < self.AUTO_FASTOKENS_CHARS:
            return None
        self._auto_chars = -1  # decided, whatever happens below
        if not self._fastokens_exact():
            return None
        try:
            self._fast = _encodings.load_fastokens(self.encoding_name)
        except ImportError:
            return None
        self._direct_encode = None  # counts_of now calls _encode_counts (fastokens)
        return self._fast

    def _encode_counts(self, texts: list[str]) -> list[int]:
        fast = self._fast
        if fast is None and self._auto_chars >= 0:  # engine "fastokens", or "auto" not decided yet
            fast = self._engage_fastokens(texts)
        if fast is not None:
            try:
                if len(texts) == 1:
                    return [len(fast.encode_ordinary(texts[0]))]
                return np.diff(np.frombuffer(fast.encode_batch_flat(texts)[1], dtype=np.uint64)).tolist()
            except UnicodeEncodeError:  # lone surrogates: tiktoken's repair, below
                pass
        # A plain loop: on 2 cores it beat encode_ordinary_batch's thread pool for short and
        # long texts alike (measured; see benchmarks/test_count.py).
        encode = self._core_encode
        if encode is not None:
            try:
                if len(texts) == 1:  # the agent loop's turn: mostly one new text
                    return [len(encode(texts[0]))]
                return [len(encode(t)) for t in texts]
            except UnicodeEncodeError:  # lone surrogates: tiktoken's own repair, text by text
                pass
        enc = self._enc
        return [len(enc.encode_ordinary(t)) for t in texts]

    def count_tools(self, tools_schema: Sequence[dict[str, Any]] | None) -> int:
        """Tokens of a request's ``tools`` list, by the cookbook's formula (see
        ``_tools_count.openai_tools_tokens``; exact on its example, an approximation otherwise).

        >>> tools = [{"type": "function", "function": {"name": "get_time",
        ...           "description": "Current time.", "parameters": {"type": "object", "properties": {}}}}]
        >>> TiktokenTokenCounter("o200k_base").count_tools(tools)
        24
        """
        if not tools_schema:
            return 0
        return openai_tools_tokens(tools_schema, self.count_text, 7 if self.encoding_name == "o200k_base" else 10)

    # -- pickling by name ---------------------------------------------------------------------

    def _pickle_name(self) -> str:
        if self._by_name:
            return self.encoding_name
        enc, name = self._enc, self.encoding_name
        import tiktoken.registry

        if enc is tiktoken.registry.ENCODINGS.get(name) or _encodings.is_loaded(enc):
            return name
        if name in _encodings.SHIPPED_ENCODINGS and _encodings.same_encoding(
            enc, _encodings.load_tiktoken_encoding(name)
        ):
            return name
        import pickle

        raise pickle.PicklingError(
            f"TiktokenTokenCounter: the tiktoken.Encoding {name!r} it was built from is not a "
            "registered encoding, so it cannot be pickled by name (vocabularies are never shipped "
            "to workers). Build the counter from a name instead (TiktokenTokenCounter('o200k_base')), "
            "or register your encoding as a tiktoken_ext plugin so tiktoken.get_encoding(name) finds it."
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"encoding": self._pickle_name(), "cache_size": self.cache_size, "image_tokens": self.image_tokens,
                "engine": self.engine}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["encoding"], cache_size=state["cache_size"],  # type: ignore[misc]
                      image_tokens=state["image_tokens"], engine=state.get("engine", "auto"))


class HFTokenCounter(CachedChatCounter):
    """Exact counts with a HuggingFace fast tokenizer plus a ChatML-like overhead.

    ``tokenizer`` is a path to a ``tokenizer.json``, a model directory holding one, a model id
    (``"org/name"``) already in the local HuggingFace cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``
    or ``~/.cache/huggingface/hub``; ``revision=`` picks a branch, tag or commit, default
    ``main``; read offline, ``huggingface_hub`` is not imported), a ``tokenizers.Tokenizer`` or a
    ``transformers`` fast tokenizer (its ``backend_tokenizer`` is used; transformers is never
    imported). A path or id that gives no ``tokenizer.json`` raises ``TokenizerLoadError``
    saying where it looked. The counter works on a private copy with truncation and padding off, so
    ``count_text(t) == len(tok.encode(t, add_special_tokens=False).ids)`` for the tokenizer
    with truncation off; text that spells an added token is matched as the tokenizer does.
    It needs the optional ``tokenizers`` package (``pip install 'jianmu_fast[hf]'``); without
    it the constructor raises ``ImportError`` naming that extra.

    Chat templates differ per model; the constants follow ChatML
    (``<|im_start|>role\\n ... <|im_end|>\\n``) and Hermes-style tool calls. Subclass and
    override them for another template::

        count_message(m) = PER_MESSAGE (4) + tokens(role)
                         + tokens(content)                      # str, or each text block
                         + image_tokens per non-text block      # default 85
                         + tokens(name) + PER_NAME (1)          # if name is set
                         + tokens(tool_call_id)                 # if set (some templates print it)
                         + per tool call: PER_TOOL_CALL (12) + tokens(function.name)
                                          + tokens(function.arguments)
        count_messages(ms) = PER_REQUEST (3) + sum(count_message(m))   # <|im_start|>assistant\\n

    Counts are cached, the counter is thread-safe, and one built from a path pickles by that
    path (checked against the file's sha256 when unpickled) and engine.

    ``engine`` picks what tokenizes cache misses; counts are identical (property tests on every
    bundled tokenizer, and a check when the counter is built):

    - ``"tokenizers"``: HuggingFace ``tokenizers``, the reference;
    - ``"fastokens"`` (``pip install 'jianmu_fast[fast]'``): the same ``tokenizer.json`` loaded
      by fastokens, 10-150x faster on unseen text (a 3 kB JSON tool result: ~6 us against
      ~0.7-1 ms on a byte-level BPE with a cl100k-style regex), but ~1 s more to load a
      13 MB ``tokenizer.json`` and ~90 MiB more memory (once per file content and process). ``ValueError`` if fastokens
      cannot load the tokenizer (e.g. a ``BertNormalizer``) or fails the load-time check: the
      tokenizer's added tokens in every position, whitespace runs, digits, JSON, scripts and
      emoji encoded by both, every id equal;
    - ``"auto"`` (default): tokenizers until this counter has tokenized
      ``AUTO_FASTOKENS_CHARS`` (5 million) characters (cache misses; hits cost nothing), then
      fastokens if it is installed, loads the tokenizer and passes that check (silently
      tokenizers otherwise). ``engine_in_use`` says which. Short runs (a CLI call, a test, a Ray
      worker's few batches) never pay the twin's load; a long one pays it once it has paid for
      itself: on a 13 MB byte-level BPE ``tokenizer.json`` (2-core EPYC) tokenizers takes
      0.27-0.41 us a character of JSON (batch / one text), fastokens ~0.003, and the twin
      ~1.0-1.3 s to load and check, so the load breaks even at 2.7-4.1 M characters; switching
      at 5 M costs at most ~2x what either engine alone would have (the ski-rental bound).
      A pickled or copied counter starts counting again (its caches start empty too).

    >>> import os, jianmu_fast
    >>> path = os.path.join(os.path.dirname(jianmu_fast.__file__), "..", "tests", "data",
    ...                     "all-MiniLM-L6-v2.tokenizer.json")
    >>> c = HFTokenCounter(path)
    >>> c.count_text("hello world"), c.count_text("hello " * 200)
    (2, 200)
    """

    PER_MESSAGE = 4
    PER_NAME = 1
    PER_TOOL_CALL = 12
    PER_REQUEST = 3
    PER_TOOL = 1
    COUNT_TOOL_CALL_ID = True
    #: ``engine="auto"`` moves to fastokens once the counter has tokenized this many characters
    AUTO_FASTOKENS_CHARS = 5_000_000

    def __init__(self, tokenizer: Any, *, cache_size: int = DEFAULT_CACHE_SIZE, image_tokens: int = 85,
                 revision: str | None = None, engine: str = "auto") -> None:
        import os

        _encodings.check_hf_engine(engine)
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # the optional extra [hf]; the core install leaves it out
            raise ImportError(
                "HFTokenCounter needs the optional HuggingFace tokenizers package: "
                "pip install 'jianmu_fast[hf]'"
            ) from exc

        self._init_cache(cache_size, image_tokens)
        self.path: str | None = None
        self._sha256: str | None = None
        if isinstance(tokenizer, (str, os.PathLike)):
            path = _encodings.find_hf_tokenizer(tokenizer, revision)
            self._tok, self.path, self._sha256 = _encodings.load_hf_tokenizer(path)
        elif isinstance(tokenizer, Tokenizer):
            self._tok = _encodings.copy_hf_tokenizer(tokenizer)
        elif isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
            self._tok = _encodings.copy_hf_tokenizer(tokenizer.backend_tokenizer)
        else:
            raise TypeError(
                "tokenizer: expected a path to a tokenizer.json, a tokenizers.Tokenizer or a "
                f"transformers fast tokenizer (with .backend_tokenizer), got {type(tokenizer).__name__}"
            )
        self.engine: str = engine
        # the fastokens twin of _tok (None: tokenizers), see ``engine``; "auto" loads it lazily
        self._fast: Any = None
        # characters tokenized so far (engine="auto"); -1: engine decided
        self._auto_chars = 0 if engine == "auto" else -1
        if engine == "fastokens":
            self._fast = _encodings.hf_fastokens(self._tok, engine, self._sha256, "HFTokenCounter")

    def __repr__(self) -> str:
        tail = f", engine={self.engine!r}" if self.engine != "auto" else ""
        return f"HFTokenCounter({self.path!r}{tail})" if self.path else f"HFTokenCounter(<tokenizers.Tokenizer>{tail})"

    @property
    def engine_in_use(self) -> str:
        """``"fastokens"`` when this counter tokenizes with fastokens (for ``engine="auto"``:
        once it has tokenized ``AUTO_FASTOKENS_CHARS`` characters), else ``"tokenizers"``."""
        return "tokenizers" if self._fast is None else "fastokens"

    def _encode_counts(self, texts: list[str]) -> list[int]:
        fast = self._fast
        if fast is None and self._auto_chars >= 0:
            self._auto_chars, fast = _encodings.hf_auto_step(self, self._sha256, texts, "HFTokenCounter")
        if fast is not None:
            try:
                return _encodings.fastokens_counts(fast, texts)
            except Exception:  # lone surrogates...: tokenizers' own outcome, below
                pass
        tok = self._tok
        if len(texts) == 1:
            return [len(tok.encode(texts[0], add_special_tokens=False))]
        # one parallel pass (encode_batch was ~2x a Python loop on 2 cores); the _fast
        # variant (tokenizers >= 0.20) skips the offsets, which counting never reads
        batch = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        return [len(e) for e in batch(texts, add_special_tokens=False)]

    def count_tools(self, tools_schema: Sequence[dict[str, Any]] | None) -> int:
        """``sum(PER_TOOL + tokens(json.dumps(tool, ensure_ascii=False)))``: each tool as chat
        templates print it with ``tojson``; the template's fixed tools preamble is not included.

        >>> import os, jianmu_fast
        >>> path = os.path.join(os.path.dirname(jianmu_fast.__file__), "..", "tests", "data",
        ...                     "all-MiniLM-L6-v2.tokenizer.json")
        >>> HFTokenCounter(path).count_tools([{"name": "f"}])
        10
        """
        if not tools_schema:
            return 0
        return json_tools_tokens(tools_schema, self.count_text, self.PER_TOOL)

    def __getstate__(self) -> dict[str, Any]:
        if self.path is None:
            import pickle

            raise pickle.PicklingError(
                "HFTokenCounter built from a tokenizer object cannot be pickled without shipping its "
                "vocabulary. Save it (tok.save('tokenizer.json'), or "
                "tok.backend_tokenizer.save(...) for a transformers tokenizer) and build the counter "
                "from that path: HFTokenCounter('tokenizer.json')."
            )
        return {"path": self.path, "sha256": self._sha256, "cache_size": self.cache_size,
                "image_tokens": self.image_tokens, "engine": self.engine}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], cache_size=state["cache_size"], image_tokens=state["image_tokens"],  # type: ignore[misc]
                      engine=state.get("engine", "auto"))
        if self._sha256 != state["sha256"]:
            from ...errors import TokenizerLoadError

            raise TokenizerLoadError(
                f"HFTokenCounter: {state['path']!r} changed since the counter was pickled (sha256 "
                f"{self._sha256}, expected {state['sha256']}); counts would differ between processes. "
                "Give every process the same tokenizer.json."
            )
