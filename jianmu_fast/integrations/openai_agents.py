"""OpenAI Agents SDK: a ``call_model_input_filter`` that trims the model input with a builder.

``pip install 'jianmu_fast[agents]'``; the SDK is imported only when the filter runs.

The SDK hands the filter the input items of the next model call (Responses-format items:
messages, ``reasoning``, ``function_call``, ``function_call_output``) and the agent's
instructions. :func:`call_model_input_filter` converts the items with
:func:`~jianmu_fast.integrations.openai_responses.from_responses` (through a
``ResponsesConverter`` that converts only the items new since the last call; a model
response's reasoning
and calls become one assistant message, each output a tool message), runs the
:class:`~jianmu_fast.memory.context.ContextBuilder` (``transform`` for a builder with filters
only, ``build({"messages": ..., "context": ...})`` when it has providers), and returns the
kept items, unchanged, with the instructions untouched. A ``call_id`` pairing is kept or
dropped whole, so the request never holds a ``function_call_output`` without its call.
The budget covers the input items; the instructions travel beside them (put the persona in a
``StaticPromptProvider`` instead to have it counted). The run's own history is not changed:
the next call gets the whole history again.

Usage (two lines)::

    from jianmu_fast.integrations.openai_agents import call_model_input_filter
    run_config = RunConfig(call_model_input_filter=call_model_input_filter(builder))

Or trim what a ``Session`` hands the runner at the start of each run, storing everything:
``session = TrimmedSession(SQLiteSession("user-1", "db.sqlite"), builder)`` (see
:class:`TrimmedSession`; the filter trims every model call, the session only the history a
run starts from).

>>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
>>> f = call_model_input_filter(ContextBuilder(filters=[MaxMessagesFilter(1)]))
>>> callable(f)
True
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from .openai_responses import ResponsesConverter

__all__ = ["call_model_input_filter", "trim_items", "TrimmedSession"]

_EXTRA_HINT = "pip install 'jianmu_fast[agents]'"


def _plain(item: Any) -> Any:
    """A Responses item as a dict (the SDK passes dicts; its pydantic items also work)."""
    if type(item) is dict or isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return dump(exclude_unset=True, mode="json")
    return item


def trim_items(builder: Any, items: Any, context: Any = None, converter: Any = None, *,
               tools_schema: Optional[Sequence[dict[str, Any]]] = None) -> list[dict[str, Any]]:
    """Run ``builder`` over Responses input items and return the kept items.

    ``converter`` (a :class:`~jianmu_fast.integrations.openai_responses.ResponsesConverter`)
    carries conversions from one call to the next; the filter keeps one. ``tools_schema``
    goes to the builder (a ``TokenBudgetFilter`` budgets it).

    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    >>> trim_items(ContextBuilder(filters=[MaxMessagesFilter(1)]), items)
    [{'role': 'user', 'content': 'b'}]
    """
    if isinstance(items, str):  # the SDK allows a bare string as the whole input
        items = [{"role": "user", "content": items}]
    conv = converter if converter is not None else ResponsesConverter()
    msgs = conv.from_responses([_plain(i) for i in items])
    kw = {} if tools_schema is None else {"tools_schema": tools_schema}
    if getattr(builder, "providers", None):
        out = builder.build({"messages": msgs, "context": context}, **kw)
    else:
        out = builder.transform(msgs, **kw)
    return conv.to_responses(out)


def call_model_input_filter(builder: Any) -> Callable[[Any], Any]:
    """A ``RunConfig.call_model_input_filter`` that trims each model call's input with ``builder``.

    Raises ``TypeError`` for something that is not a ``ContextBuilder``; the returned
    filter raises ``ImportError`` naming the extra when the SDK is missing.
    """
    if not callable(getattr(builder, "transform", None)):
        raise TypeError(f"builder: expected a ContextBuilder, got {type(builder).__name__}")
    converter = ResponsesConverter()

    def _filter(data: Any) -> Any:
        try:
            from agents.run_config import ModelInputData
        except ImportError as exc:  # pragma: no cover - the extra is installed in CI
            raise ImportError(f"jianmu_fast.integrations.openai_agents needs openai-agents: {_EXTRA_HINT}") from exc
        md = data.model_data
        items: Any = trim_items(builder, md.input, getattr(data, "context", None), converter)
        return ModelInputData(input=items,
                              instructions=md.instructions)

    return _filter


class TrimmedSession:
    """An Agents SDK ``Session`` that stores everything and hands the runner trimmed history.

    Wraps another session (``SQLiteSession``, a Redis or SQLAlchemy session...): ``add_items``,
    ``pop_item`` and ``clear_session`` go to it untouched, so nothing stored is lost or
    changed. ``get_items()`` reads the whole history from it and returns what ``builder``
    keeps (:func:`trim_items`): the kept items themselves, a ``function_call`` never without
    its ``function_call_output`` nor the other way round. ``tools_schema`` (the agent's tools,
    optional) is passed to the builder so a ``TokenBudgetFilter`` leaves room for them; the
    agent's instructions and the run's new input travel beside the history.

    ``get_items(limit=N)`` returns the wrapped session's newest ``N`` items as stored: the SDK
    reads the tail that way to verify its own writes, and a trimmed tail would fail that
    check. So put the limit in the builder (``MaxMessagesFilter``), not in
    ``RunConfig(session_settings=...)``; the wrapper's own ``session_settings`` is ``None``, so
    a limit set on the wrapped session still applies to what it returns to be trimmed.

    The session trims the history a run starts from; within a run, each tool round adds to the
    model input, which :func:`call_model_input_filter` trims call by call.

    >>> import asyncio
    >>> from agents import SQLiteSession
    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> s = TrimmedSession(SQLiteSession("demo"), ContextBuilder(filters=[MaxMessagesFilter(1)]))
    >>> loop = asyncio.new_event_loop()
    >>> loop.run_until_complete(s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    >>> loop.run_until_complete(s.get_items()), len(loop.run_until_complete(s.session.get_items()))
    ([{'role': 'user', 'content': 'b'}], 2)
    >>> loop.close(); s.session.close()
    """

    session_settings: Any = None

    def __init__(self, session: Any, builder: Any, *,
                 tools_schema: Optional[Sequence[dict[str, Any]]] = None) -> None:
        if not callable(getattr(builder, "transform", None)):
            raise TypeError(f"builder: expected a ContextBuilder, got {type(builder).__name__}")
        missing = [n for n in ("get_items", "add_items", "pop_item", "clear_session")
                   if not callable(getattr(session, n, None))]
        if missing or not hasattr(session, "session_id"):
            raise TypeError(f"session: expected an Agents SDK Session, {type(session).__name__} lacks "
                            f"{', '.join(missing) or 'session_id'}")
        self.session = session
        self.builder = builder
        self.tools_schema = tools_schema
        self._converter = ResponsesConverter()

    @property
    def session_id(self) -> str:
        """The wrapped session's id."""
        return self.session.session_id  # type: ignore[no-any-return]

    async def get_items(self, limit: Optional[int] = None) -> list[Any]:
        """The trimmed history (``limit=None``), or the newest ``limit`` items as stored."""
        if limit is not None:
            return await self.session.get_items(limit)  # type: ignore[no-any-return]
        items = await self.session.get_items()
        return trim_items(self.builder, items, None, self._converter, tools_schema=self.tools_schema)

    async def add_items(self, items: list[Any]) -> None:
        """Store ``items`` in the wrapped session, untouched."""
        await self.session.add_items(items)

    async def pop_item(self) -> Any:
        """Remove and return the wrapped session's newest item."""
        return await self.session.pop_item()

    async def clear_session(self) -> None:
        """Clear the wrapped session."""
        await self.session.clear_session()
