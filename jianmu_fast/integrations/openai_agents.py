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

>>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
>>> f = call_model_input_filter(ContextBuilder(filters=[MaxMessagesFilter(1)]))
>>> callable(f)
True
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .openai_responses import ResponsesConverter

__all__ = ["call_model_input_filter", "trim_items"]

_EXTRA_HINT = "pip install 'jianmu_fast[agents]'"


def _plain(item: Any) -> Any:
    """A Responses item as a dict (the SDK passes dicts; its pydantic items also work)."""
    if type(item) is dict or isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return dump(exclude_unset=True, mode="json")
    return item


def trim_items(builder: Any, items: Any, context: Any = None, converter: Any = None) -> list[dict[str, Any]]:
    """Run ``builder`` over Responses input items and return the kept items.

    ``converter`` (a :class:`~jianmu_fast.integrations.openai_responses.ResponsesConverter`)
    carries conversions from one call to the next; the filter keeps one.

    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> items = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    >>> trim_items(ContextBuilder(filters=[MaxMessagesFilter(1)]), items)
    [{'role': 'user', 'content': 'b'}]
    """
    if isinstance(items, str):  # the SDK allows a bare string as the whole input
        items = [{"role": "user", "content": items}]
    conv = converter if converter is not None else ResponsesConverter()
    msgs = conv.from_responses([_plain(i) for i in items])
    if getattr(builder, "providers", None):
        out = builder.build({"messages": msgs, "context": context})
    else:
        out = builder.transform(msgs)
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
