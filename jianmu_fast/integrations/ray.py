"""Scale prompt assembly out on Ray Data (the ``jianmu_fast[ray]`` extra).

:class:`BuildPrompts` is a picklable callable class for ``Dataset.map_batches``: each Ray
worker builds its ``ContextBuilder`` and token counter **once**, from a *spec*, then turns
every batch of conversations into prompts with :func:`~jianmu_fast.batch.build_batch_report`,
the same code path as the local command line. :func:`build_dataset` wires it up::

    import ray
    from jianmu_fast.integrations.ray import build_dataset

    ds = ray.data.read_parquet("conversations.parquet")          # a "messages" column
    out = build_dataset(ds, {"preset": "react", "max_tokens": 8000, "tokenizer": "o200k_base"})
    out.write_parquet("prompts/")

The spec is a plain dict with the command line's names (``preset``, ``system_prompt`` /
``system_prompt_file``, ``tools_desc`` / ``tools_desc_file``, ``tools`` / ``tools_file``,
``skills_dir``, ``workspace_dir``, ``max_messages``, ``max_tokens``, ``tokenizer``, ``format``), or a
picklable zero-argument factory returning ``(builder, counter)`` (or just a builder: the
counter is then the builder's budget counter, else ``o200k_base``). Unknown keys are an error.

Input batches (pyarrow ``Table``, pandas ``DataFrame`` or a dict of arrays, whatever
``batch_format`` delivers) hold a ``messages`` column of chat-completions message lists
(``None``-valued fields, which Arrow adds when it unifies message structs, are ignored).
The output batch has every other column unchanged, and:

- ``messages``: the prompt (chat-completions dicts), ``None`` for a failed row;
- ``prompt_tokens``: its count by the spec's tokenizer (the request's tools included);
- ``dropped``: ``{"messages": k, "tokens": t, "indices": [...]}``, the input messages left
  out of the prompt, as the command line reports them;
- ``error``: ``None``, or ``"ErrorType: reason"`` for a row that failed under
  ``on_error="skip"`` (it is logged with its identity: ``id_column``'s value when given).
  Under ``on_error="raise"`` (the default) a bad row raises
  :class:`~jianmu_fast.errors.BatchError` and fails the job.

Nothing here schedules work: retries of dead workers, back-pressure and placement are Ray
Data's. A worker that dies mid-batch is restarted by Ray and its batch redone; the output
holds each row exactly once.
"""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from ..cli.reading import drop_nulls as _strip_none  # Arrow's null-filled message structs, read as given
from ..errors import BatchError

__all__ = ["BuildPrompts", "build_dataset", "SPEC_KEYS", "builder_from_spec", "run_lines"]

logger = logging.getLogger("jianmu_fast.integrations.ray")

#: the keys a spec dict may hold (the command line's flag names, with underscores)
SPEC_KEYS = frozenset({
    "preset", "system_prompt", "system_prompt_file", "tools_desc", "tools_desc_file", "tools",
    "tools_file", "skills_dir", "workspace_dir", "max_messages", "max_tokens", "tokenizer", "format",
})

Spec = Union[Mapping[str, Any], Callable[[], Any]]


def _require_ray() -> Any:
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            "jianmu_fast.integrations.ray needs Ray Data: pip install 'jianmu_fast[ray]'"
        ) from exc
    import ray

    return ray


def builder_from_spec(spec: Spec) -> tuple[Any, Any, Optional[list[dict[str, Any]]], Any]:
    """``(builder, counter, tools_schema, args)`` for a spec dict or factory; ``args`` are the
    ``jianmu-fast build`` arguments the spec stands for (``cli.spec_namespace``).

    >>> b, c, tools, args = builder_from_spec({"preset": "react", "max_tokens": 500, "tokenizer": "simple"})
    >>> [type(f).__name__ for f in b.filters], c, tools
    (['TokenBudgetFilter'], SimpleTokenCounter(chars_per_token=4), None)
    >>> builder_from_spec({"max_token": 5})
    Traceback (most recent call last):
    ...
    ValueError: spec: unknown key 'max_token' (did you mean 'max_tokens'?); accepted keys: format, max_messages, max_tokens, preset, skills_dir, system_prompt, system_prompt_file, tokenizer, tools, tools_desc, tools_desc_file, tools_file, workspace_dir
    """
    from ..cli import load_tools, make_builder, make_counter, spec_namespace

    if callable(spec):
        made = spec()
        builder, counter = made if isinstance(made, tuple) else (made, None)
        if counter is None:
            counter = _budget_counter(builder)
        return builder, counter, None, spec_namespace({})
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec: expected a dict of command-line names or a factory, got {type(spec).__name__}")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        import difflib

        key = unknown[0]
        close = difflib.get_close_matches(key, sorted(SPEC_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"spec: unknown key {key!r}{hint}; accepted keys: {', '.join(sorted(SPEC_KEYS))}")
    args = spec_namespace({k: v for k, v in spec.items() if k != "tools"})
    counter = make_counter(args.tokenizer)
    builder = make_builder(args, counter)
    tools = spec.get("tools")
    if tools is None and args.tools_file is not None:
        tools = load_tools(args.tools_file)
    return builder, counter, (list(tools) if tools is not None else None), args


def _budget_counter(builder: Any) -> Any:
    from ..memory.context import TiktokenTokenCounter, TokenBudgetFilter

    for f in getattr(builder, "filters", ()):
        if isinstance(f, TokenBudgetFilter):
            return f.counter
    return TiktokenTokenCounter("o200k_base")


class BuildPrompts:
    """``Dataset.map_batches`` callable: conversations in, prompts out (see the module doc).

    Construct it on the driver with the spec; Ray pickles it to each worker, where the
    builder and counter are made on first use, once per worker.

    >>> bp = BuildPrompts({"preset": "chat", "system_prompt": "Be brief.", "tokenizer": "simple"})
    >>> out = bp({"id": [7], "messages": [[{"role": "user", "content": "hi"}]]})
    >>> out["id"], [m["content"] for m in out["messages"][0]], out["prompt_tokens"], out["error"]
    ([7], ['Be brief.', 'hi'], [15], [None])
    """

    def __init__(
        self,
        spec: Spec,
        *,
        on_error: str = "raise",
        messages_column: str = "messages",
        id_column: Optional[str] = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.spec = spec
        self.on_error = on_error
        self.messages_column = messages_column
        self.id_column = id_column
        self._made: Optional[tuple[Any, Any, Any, Any]] = None
        if not callable(spec):
            builder_from_spec(spec)  # fail on the driver, not in every worker

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_made"] = None  # each worker builds its own
        return state

    def _engine(self) -> tuple[Any, Any, Any, Any]:
        if self._made is None:
            self._made = builder_from_spec(self.spec)
        return self._made

    def __call__(self, batch: Any) -> Any:
        columns, kind = _to_columns(batch)
        if self.messages_column not in columns:
            raise KeyError(
                f"BuildPrompts: the batch has no {self.messages_column!r} column (columns: {sorted(columns)})"
            )
        raw = columns[self.messages_column]
        ids = columns.get(self.id_column) if self.id_column else None
        out = self.build_rows([_strip_none(r) for r in raw], ids)
        columns = dict(columns)
        for key in ("messages", "prompt_tokens", "dropped", "error"):
            columns.pop(key, None)
        columns[self.messages_column] = out["messages"]
        for key in ("prompt_tokens", "dropped", "error"):
            columns[key] = out[key]
        return _from_columns(columns, kind)

    def build_rows(self, conversations: Sequence[Any], ids: Optional[Sequence[Any]] = None) -> dict[str, list[Any]]:
        """The output columns for a list of conversations (message lists)."""
        from ..cli import process_conversations

        builder, counter, tools, args = self._engine()
        results = process_conversations(conversations, builder, counter, tools, args)
        out: dict[str, list[Any]] = {"messages": [], "prompt_tokens": [], "dropped": [], "error": []}
        for i, res in enumerate(results):
            if res.error is not None:
                who = f"{self.id_column}={ids[i]!r}" if ids is not None else f"row {i} of its batch"
                if self.on_error == "raise":
                    raise BatchError(f"BuildPrompts: {who}: {res.error}")
                logger.warning("BuildPrompts: %s: %s (skipped)", who, res.error)
            out["messages"].append(res.messages)
            out["prompt_tokens"].append(res.prompt_tokens)
            out["dropped"].append(res.dropped)
            out["error"].append(res.error)
        return out


def _to_columns(batch: Any) -> tuple[dict[str, list[Any]], str]:
    mod = type(batch).__module__
    if mod.startswith("pyarrow"):
        return {name: batch.column(name).to_pylist() for name in batch.column_names}, "pyarrow"
    if mod.startswith("pandas"):
        return {str(name): batch[name].tolist() for name in batch.columns}, "pandas"
    if isinstance(batch, Mapping):
        return {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in batch.items()}, "dict"
    raise TypeError(f"BuildPrompts: expected a pyarrow Table, a pandas DataFrame or a dict batch, got {type(batch).__name__}")


def _from_columns(columns: dict[str, list[Any]], kind: str) -> Any:
    if kind == "pandas":
        import pandas as pd

        return pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in columns.items()})
    if kind == "pyarrow":
        # Message dicts differ in shape (content as text or blocks, optional keys), which Arrow
        # cannot always unify into one struct type: the prompt travels as JSON-safe Python
        # objects in a dict batch, which Ray stores as it can.
        import numpy as np

        return {k: _object_array(v, np) for k, v in columns.items()}
    return columns


def _object_array(values: list[Any], np: Any) -> Any:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values if values else []
    return arr


def build_dataset(
    ds: Any,
    spec: Spec,
    *,
    batch_size: Optional[int] = 256,
    compute: Any = None,
    on_error: str = "raise",
    messages_column: str = "messages",
    id_column: Optional[str] = None,
) -> Any:
    """``ds.map_batches(BuildPrompts, ...)``: one prompt per input row, other columns kept.

    ``compute`` is Ray Data's worker-pool argument (``ray.data.ActorPoolStrategy(size=n)``;
    default an autoscaling actor pool), ``batch_size`` rows per call. Rows come out in input
    order when the dataset's ``DataContext.execution_options.preserve_order`` is set (the
    command line sets it).
    """
    ray = _require_ray()
    if compute is None:
        compute = ray.data.ActorPoolStrategy(min_size=1, max_size=None)
    fn = BuildPrompts(spec, on_error=on_error, messages_column=messages_column, id_column=id_column)
    return ds.map_batches(
        _Worker,
        fn_constructor_args=(fn,),
        batch_size=batch_size,
        compute=compute,
        batch_format="pyarrow",
        zero_copy_batch=False,
    )


class _Worker:
    """The actor class Ray instantiates per worker; holds one ``BuildPrompts``."""

    def __init__(self, fn: BuildPrompts) -> None:
        self.fn = fn
        self.fn._engine()

    def __call__(self, batch: Any) -> Any:
        return self.fn(batch)



# -- the command line's engine (jianmu-fast build --engine ray) ---------------------------------

_DATASET_LINES = 100_000  # input lines per Ray dataset: bounds the driver's memory


def _portable_args(args: Any) -> Any:
    """``args`` with file flags read on the driver, so workers on other nodes need no copy of
    them (``--skills-dir`` and ``--workspace-dir`` must still be visible on every node)."""
    from ..cli.common import read_text

    ns = copy.copy(args)
    if ns.system_prompt_file is not None:
        ns.system_prompt = read_text(ns.system_prompt_file, "--system-prompt-file")
        ns.system_prompt_file = None
    if ns.tools_desc_file:
        ns.tools_desc = read_text(ns.tools_desc_file, "--tools-desc-file")
        ns.tools_desc_file = None
    ns.engine = "local"
    ns.workers = 1
    return ns


class _LinesWorker:
    """A Ray Data actor: builds the ``build`` job once, then processes batches of input lines
    exactly as the local engine does (``cli.processing.process``); each line comes back pickled."""

    def __init__(self, args: Any, tools: Any, src_name: str) -> None:
        from ..cli import make_builder, make_counter
        from ..cli.processing import Job

        counter = make_counter(args.tokenizer)
        self.job = Job(args, make_builder(args, counter), counter, None, src_name, tools)  # type: ignore[arg-type]

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        from ..cli.processing import process

        linenos = batch.column("lineno").to_pylist()
        raws = batch.column("raw").to_pylist()
        lines = process(list(zip(linenos, raws)), self.job)
        return pa.table({
            "lineno": pa.array([line.lineno for line in lines], pa.int64()),
            "line": pa.array([pickle.dumps(line) for line in lines], pa.binary()),
        })


def run_lines(job: Any, chunks: Iterator[list[tuple[int, bytes]]]) -> Iterator[list[Any]]:
    """Process the command line's input lines on Ray Data; yields the processed lines (the
    local engine's ``cli.processing.Line`` objects) in input order, a batch at a time.

    Connects to ``job.args.ray_address`` when given (else starts a local instance, stopped at
    the end); ``--workers N`` (N > 1) fixes the actor pool's size, else it scales with the
    cluster. Input lines travel as bytes, so that every failure of a line (bytes that are not
    UTF-8 included) is that line's error, as locally.
    """
    ray = _require_ray()
    started = False
    if not ray.is_initialized():
        address = job.args.ray_address
        try:
            ray.init(address=address, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False, configure_logging=False)
        except Exception as exc:  # unreachable address, refused token, ...: a usage error, exit 2
            from ..cli import UsageError

            where = f"the cluster at {address}" if address else "a local Ray instance"
            hint = (" (a token-authenticated cluster needs RAY_AUTH_MODE=token and its token in "
                    "RAY_AUTH_TOKEN or ~/.ray/auth_token)" if address else "")
            raise UsageError(f"--engine ray: cannot reach {where}: {type(exc).__name__}: {exc}{hint}") from None
        started = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        args = _portable_args(job.args)
        workers = job.args.workers
        compute = (ray.data.ActorPoolStrategy(size=workers) if workers > 1
                   else ray.data.ActorPoolStrategy(min_size=1, max_size=None))
        from ..cli.reading import CHUNK

        for group in _regroup(chunks, _DATASET_LINES):
            ds = ray.data.from_items([{"lineno": n, "raw": raw} for n, raw in group])
            out = ds.map_batches(
                _LinesWorker, fn_constructor_args=(args, job.tools, job.src_name), batch_size=CHUNK,
                compute=compute, batch_format="pyarrow", zero_copy_batch=False,
            )
            for batch in out.iter_batches(batch_size=None, batch_format="pyarrow"):
                yield [pickle.loads(b) for b in batch.column("line").to_pylist()]
    finally:
        if started:
            ray.shutdown()


def _regroup(chunks: Iterator[list[tuple[int, bytes]]], size: int) -> Iterator[list[tuple[int, bytes]]]:
    group: list[tuple[int, bytes]] = []
    for chunk in chunks:
        group.extend(chunk)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group
