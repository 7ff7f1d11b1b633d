"""LLM nodes: the design document's "端到端数据流", from the stored history to the model call.

Each ``update()`` / ``update_async()`` step does, in the document's order::

    _prepare_messages()             the history, read from the node's StateMessageStore
    _resolve_context_builder(ctx)   resolve_for_llm(builder, runtime_prompt=..., prefer_react=...)
    builder.build(local_state, global_state, ctx, tools_schema)   providers, then filters
    client.invoke(messages=..., tools=..., config=...)             the ModelClient

then stores the reply. The caller appends the user's turn to the store first; ``update``
returns the final assistant :class:`~jianmu_fast.message.Message`.

- ``runtime`` (a ``PromptRuntimeContext``) is the node's default; a ``ctx`` whose
  ``prompt_runtime`` is set (a ``RunContext``) overrides it for that call. The builder is
  ``builder`` when given, else ``runtime_prompt.context_builder``, else a preset:
  ``SimpleLLMNode`` resolves without ``prefer_react`` (``for_chat``), ``AgentLLMNode`` with
  ``prefer_react=True`` (``for_react``, whose ``ToolsDescProvider`` is present only when the node
  has tools). ``system_prompt``, ``max_messages``, ``max_tokens`` and ``token_counter`` go to the
  preset. The resolved builder is kept while the runtime stays the same, so the history
  provider's caches carry over from turn to turn.
- ``local_state`` (a mapping) is passed to the builder with ``"messages"`` set to the history.
- ``AgentLLMNode`` offers its tools (``tools_schema``, and ``tools_desc`` for the system
  prompt) and runs the tool loop: for a reply with tool calls it runs each tool in call order
  and stores the reply together with its tool messages in one ``extend`` (one transaction),
  then asks the model again. A tool message carries ``tool_call_id``, ``name`` and
  ``metadata["tool_result"]`` (the returned value, so ``StateHistoryProvider`` shows it as an
  execution receipt). A tool that raises (or an unknown tool name, or arguments the function
  does not take) gives a tool message ``"Error: <type>: <text>"`` with
  ``metadata["tool_error"]``, and the loop goes on: the model sees the error.
- ``max_steps`` bounds the model calls of one ``update``. When the last allowed reply still
  calls tools, its tools run and it is stored with their results (the history stays valid),
  then :class:`~jianmu_fast.errors.MaxStepsExceededError` is raised; ``update()`` again
  continues from the stored history.
- Nothing half-written reaches the store: a failed model call (``ModelCallError``), a
  malformed reply or a build error raises before the step writes anything, and earlier steps
  are whole transactions.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import logging
import re
import typing
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

from .errors import MaxStepsExceededError, ModelCallError
from .memory.context.presets import resolve_for_llm
from .memory.context.runtime import PromptRuntimeContext, RunContext, prompt_runtime_of
from .message import Message, StateMessageStore
from .model import check_tool_calls, parse_arguments
from .state.manager import StateManager

__all__ = ["SimpleLLMNode", "AgentLLMNode", "Tool"]

logger = logging.getLogger("jianmu_fast.nodes")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, type(None): {"type": "null"},
    list: {"type": "array"}, tuple: {"type": "array"}, dict: {"type": "object"},
}
_ARGS_HEADERS = ("args:", "arguments:", "parameters:", "params:")


# -- tools -----------------------------------------------------------------------------------


def _json_type(tp: Any, where: str) -> dict[str, Any]:
    """A JSON schema for the annotation ``tp``."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _SCALARS:
        return dict(_SCALARS[tp])
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        kinds = {type(a) for a in args}
        out: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            out = {**_SCALARS[next(iter(kinds))], **out}
        return out
    if origin is Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _json_type(options[0], where)  # Optional[X]: X, not required when defaulted
        return {"anyOf": [_json_type(a, where) for a in options]}
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        items = [a for a in args if a is not Ellipsis]
        return {"type": "array", **({"items": _json_type(items[0], where)} if len(items) == 1 else {})}
    if origin in (dict, Mapping, typing.Mapping):
        return {"type": "object"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    raise TypeError(f"{where}: cannot describe {tp!r} as JSON schema; use str, int, float, bool, list, dict, "
                    "Literal, Optional or an Enum, or pass Tool(fn, parameters={...})")


def _doc_parts(doc: Optional[str]) -> tuple[str, dict[str, str]]:
    """(summary paragraph, {parameter: description}) of a Google- or Sphinx-style docstring."""
    text = inspect.cleandoc(doc or "")
    summary_lines: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().lower() in _ARGS_HEADERS or line.strip().startswith(":"):
            break
        summary_lines.append(line.strip())
    params: dict[str, str] = {}
    in_args = False
    current: Optional[str] = None
    for line in text.splitlines():
        stripped = line.strip()
        m = re.match(r"^:param\s+(?:\S+\s+)?(\w+):\s*(.*)$", stripped)
        if m:
            params[m.group(1)] = m.group(2)
            continue
        if stripped.lower() in _ARGS_HEADERS:
            in_args, current = True, None
            continue
        if in_args:
            if not stripped:
                current = None
                continue
            if not line.startswith((" ", "\t")) and stripped.endswith(":"):
                in_args = False  # the next section (Returns:, Raises:, ...)
                continue
            m = re.match(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m:
                current = m.group(1)
                params[current] = m.group(2)
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
    return " ".join(summary_lines), params


class Tool:
    """A tool the model may call: ``name``, ``description``, JSON-schema ``parameters`` and the
    Python function that runs it (sync or ``async``).

    Built from a function, the name is the function's, the description its docstring's first
    paragraph, and the parameters come from the signature (annotations ``str``, ``int``,
    ``float``, ``bool``, ``list[...]``, ``dict``, ``Literal[...]``, ``Optional[...]``, an
    ``Enum``; a parameter without default is required) with each parameter's text from the
    docstring's ``Args:`` section (or ``:param x:`` lines).

    >>> def add(a: int, b: int = 0) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: the first addend
    ...         b: the second addend
    ...     '''
    ...     return a + b
    >>> t = Tool(add)
    >>> t.schema()["function"]["parameters"]
    {'type': 'object', 'properties': {'a': {'type': 'integer', 'description': 'the first addend'}, 'b': {'type': 'integer', 'description': 'the second addend', 'default': 0}}, 'required': ['a']}
    >>> t.name, t.description, t(a=2, b=3)
    ('add', 'Add two integers.', 5)
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        parameters: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"Tool: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Tool name {self.name!r}: expected 1-64 letters, digits, '_' or '-' (pass name=...)")
        summary, param_docs = _doc_parts(inspect.getdoc(fn))
        self.description = description if description is not None else summary
        if not isinstance(self.description, str):
            raise TypeError(f"Tool {self.name!r}: description must be a str, got {type(self.description).__name__}")
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise TypeError(f"Tool {self.name!r}: parameters must be a JSON-schema dict, got "
                                f"{type(parameters).__name__}")
            self.parameters: dict[str, Any] = dict(parameters)
        else:
            self.parameters = _parameters(fn, self.name, param_docs)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def schema(self) -> dict[str, Any]:
        """The chat-completions tool schema: ``{"type": "function", "function": {...}}``."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def __call__(self, **arguments: Any) -> Any:
        return self.fn(**arguments)


def _parameters(fn: Callable[..., Any], name: str, docs: dict[str, str]) -> dict[str, Any]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Tool {name!r}: cannot read the signature ({exc}); pass parameters={{...}}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL or p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"Tool {name!r}: parameter {p.name!r} cannot be passed by name (tools are called with "
                            "keyword arguments)")
        if p.kind is p.VAR_KEYWORD:
            continue
        prop = _json_type(hints.get(p.name, p.annotation), f"Tool {name!r}, parameter {p.name!r}")
        if p.name in docs and docs[p.name]:
            prop["description"] = docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        else:
            try:
                json.dumps(p.default)
                prop["default"] = p.default
            except (TypeError, ValueError):
                pass
        props[p.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _as_tools(tools: Any) -> list[Tool]:
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, (list, tuple)):
        raise TypeError(f"tools: expected a list of functions or Tool objects, got {type(tools).__name__}")
    out: list[Tool] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        if not isinstance(t, Tool):
            if not callable(t):
                raise TypeError(f"tools[{i}]: expected a function or a Tool, got {type(t).__name__}")
            t = Tool(t)
        if t.name in seen:
            raise ValueError(f"tools[{i}]: the name {t.name!r} is already used by tools[{seen[t.name]}]")
        seen[t.name] = i
        out.append(t)
    return out


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _result_message(call: dict[str, Any], value: Any) -> Message:
    name = call["function"]["name"]
    if isinstance(value, str):
        content = value
    else:
        content = json.dumps(value, ensure_ascii=False, default=str)
    result = value if _jsonable(value) else content
    return Message(role="tool", content=content, name=name, tool_call_id=call["id"], metadata={"tool_result": result})


def _error_message(call: dict[str, Any], exc: BaseException) -> Message:
    name = call["function"]["name"]
    text = f"{type(exc).__name__}: {exc}"
    return Message(role="tool", content=f"Error: {text}", name=name, tool_call_id=call["id"],
                   metadata={"tool_error": {"type": type(exc).__name__, "message": str(exc)},
                             "tool_result": {"error": text}})


class UnknownToolError(LookupError):
    """The model called a tool the node does not have (reported to the model, never raised)."""


# -- nodes -----------------------------------------------------------------------------------


def _as_store(store: Any) -> StateMessageStore:
    if isinstance(store, StateMessageStore):
        return store
    if isinstance(store, StateManager):
        return StateMessageStore(store)
    raise TypeError(f"store: expected a StateMessageStore or a StateManager, got {type(store).__name__}")


class SimpleLLMNode:
    """A chat node: build the prompt (``for_chat`` unless a builder or runtime says otherwise),
    call the model, store and return its reply. See the module docstring for the flow.

    >>> from jianmu_fast.model import OpenAIChatClient
    >>> from jianmu_fast.message import StateMessageStore, human
    >>> from jianmu_fast.testing import ChatCompletionsServer
    >>> store = StateMessageStore()
    >>> _ = store.append(human("Hi!"))
    >>> with ChatCompletionsServer(["Hello."]) as server:
    ...     node = SimpleLLMNode(OpenAIChatClient("m", base_url=server.base_url), store,
    ...                          system_prompt="You are terse.")
    ...     node.update().content
    'Hello.'
    >>> [m.role for m in store.list()], server.requests[0]["messages"][0]
    (['user', 'assistant'], {'role': 'system', 'content': 'You are terse.'})
    """

    prefer_react = False

    def __init__(
        self,
        client: Any,
        store: Any,
        *,
        runtime: Any = None,
        builder: Any = None,
        config: Optional[Mapping[str, Any]] = None,
        system_prompt: Optional[str] = None,
        max_messages: Optional[int] = None,
        max_tokens: Optional[int] = None,
        token_counter: Any = None,
        allow_skill_context: bool = False,
    ) -> None:
        if not callable(getattr(client, "invoke", None)):
            raise TypeError(f"client: expected a ModelClient (invoke(messages, *, tools=None, config=None)), "
                            f"got {type(client).__name__}")
        if builder is not None and not callable(getattr(builder, "build", None)):
            raise TypeError(f"builder: expected a ContextBuilder (build(local_state, ...)), got {type(builder).__name__}")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config: expected a mapping of model settings, got {type(config).__name__}")
        rp = prompt_runtime_of(runtime)
        if runtime is not None and rp is None:
            raise TypeError(f"runtime: expected a PromptRuntimeContext (or a RunContext carrying one), "
                            f"got {type(runtime).__name__}")
        self.client = client
        self.store = _as_store(store)
        self.runtime: Optional[PromptRuntimeContext] = rp
        self.builder = builder
        self.config: dict[str, Any] = dict(config or {})
        self.system_prompt = system_prompt
        self.allow_skill_context = allow_skill_context
        self._preset: dict[str, Any] = dict(max_messages=max_messages, max_tokens=max_tokens,
                                            token_counter=token_counter)
        self._resolved: Optional[tuple[Optional[PromptRuntimeContext], Any]] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(client={self.client!r}, store={self.store!r})"

    # -- the document's steps ------------------------------------------------------------------

    @property
    def tools_schema(self) -> list[dict[str, Any]]:
        """The tool schemas sent with each request (none for ``SimpleLLMNode``)."""
        return []

    @property
    def tools_desc(self) -> Optional[str]:
        """The tools text for ``ToolsDescProvider`` (``None``: this node offers no tools)."""
        return None

    def _prepare_messages(self) -> list[Message]:
        """The stored history, oldest first (the document: read from the StateManager)."""
        return self.store.list()

    def _resolve_context_builder(self, ctx: Any = None) -> Any:
        """``resolve_for_llm`` with the node's builder, ``ctx.prompt_runtime`` (else the node's
        ``runtime``), its tools text and ``prefer_react``; kept while the runtime is the same."""
        rp = prompt_runtime_of(ctx) or self.runtime
        if self._resolved is not None and self._resolved[0] == rp:
            return self._resolved[1]
        builder = resolve_for_llm(
            self.builder, runtime_prompt=rp, system_prompt=self.system_prompt, tools_desc=self.tools_desc,
            allow_skill_context=self.allow_skill_context, prefer_react=self.prefer_react, **self._preset,
        )
        self._resolved = (rp, builder)
        return builder

    def _build(self, local_state: Any, global_state: Any, ctx: Any) -> list[Message]:
        history = self._prepare_messages()
        builder = self._resolve_context_builder(ctx)
        if local_state is not None and not isinstance(local_state, Mapping):
            raise TypeError(f"local_state: expected a mapping or None, got {type(local_state).__name__}")
        state = {**(local_state or {}), "messages": history}
        if ctx is None and self.runtime is not None:
            ctx = RunContext(prompt_runtime=self.runtime)
        return builder.build(state, global_state, ctx, tools_schema=self.tools_schema or None)

    def _checked(self, reply: Any) -> Message:
        if not isinstance(reply, Message):
            raise ModelCallError(f"{type(self.client).__name__}.invoke returned {type(reply).__name__}, "
                                 "expected a Message")
        if reply.role != "assistant":
            raise ModelCallError(f"reply.role: expected 'assistant', got {reply.role!r}")
        check_tool_calls(reply)
        if reply.tool_calls and not self.tools_schema:
            raise ModelCallError(f"reply.tool_calls: the model called {reply.tool_calls[0]['function']['name']!r} "
                                 f"but {type(self).__name__} offers no tools; use AgentLLMNode", status=200)
        return reply

    def _invoke(self, messages: list[Message]) -> Message:
        return self._checked(self.client.invoke(messages, tools=self.tools_schema or None, config=self.config))

    async def _ainvoke(self, messages: list[Message]) -> Message:
        ainvoke = getattr(self.client, "ainvoke", None)
        if ainvoke is None:
            reply = await asyncio.to_thread(self.client.invoke, messages, tools=self.tools_schema or None,
                                            config=self.config)
        else:
            reply = await ainvoke(messages, tools=self.tools_schema or None, config=self.config)
        return self._checked(reply)

    # -- public ---------------------------------------------------------------------------------

    def update(self, local_state: Any = None, global_state: Any = None, ctx: Any = None) -> Message:
        """Build, invoke, store the reply and return it."""
        reply = self._invoke(self._build(local_state, global_state, ctx))
        self.store.append(reply)
        return reply

    async def update_async(self, local_state: Any = None, global_state: Any = None, ctx: Any = None) -> Message:
        """``update`` with ``client.ainvoke`` (a client without it runs ``invoke`` in a thread)."""
        reply = await self._ainvoke(self._build(local_state, global_state, ctx))
        self.store.append(reply)
        return reply


class AgentLLMNode(SimpleLLMNode):
    """A ReAct node with a tool loop (``for_react`` unless a builder or runtime says otherwise).

    ``tools`` are plain functions or :class:`Tool` objects; see the module docstring for the
    loop, tool errors and ``max_steps``.

    >>> from jianmu_fast.model import OpenAIChatClient
    >>> from jianmu_fast.message import StateMessageStore, human
    >>> from jianmu_fast.testing import ChatCompletionsServer, tool_call
    >>> def calculator(expr: str) -> float:
    ...     '''Evaluate an arithmetic expression.'''
    ...     return eval(expr, {"__builtins__": {}})
    >>> store = StateMessageStore()
    >>> _ = store.append(human("What is 6*7?"))
    >>> script = [{"tool_calls": [tool_call("calculator", {"expr": "6*7"}, "c1")]}, "Final Answer: 42"]
    >>> with ChatCompletionsServer(script) as server:
    ...     node = AgentLLMNode(OpenAIChatClient("m", base_url=server.base_url), store, [calculator])
    ...     node.update().content
    'Final Answer: 42'
    >>> [(m.role, m.metadata.get("tool_result")) for m in store.list()]
    [('user', None), ('assistant', None), ('tool', 42), ('assistant', None)]
    >>> node.tools_desc
    '- calculator: Evaluate an arithmetic expression.'
    """

    prefer_react = True

    def __init__(
        self,
        client: Any,
        store: Any,
        tools: Sequence[Any],
        *,
        runtime: Any = None,
        builder: Any = None,
        max_steps: int = 8,
        config: Optional[Mapping[str, Any]] = None,
        system_prompt: Optional[str] = None,
        max_messages: Optional[int] = None,
        max_tokens: Optional[int] = None,
        token_counter: Any = None,
        allow_skill_context: bool = False,
    ) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps: expected an int >= 1, got {max_steps!r}")
        self.tools: list[Tool] = _as_tools(list(tools) if isinstance(tools, tuple) else tools)
        self.max_steps = max_steps
        self._schema = [t.schema() for t in self.tools]
        self._desc = "\n".join(f"- {t.name}: {t.description}" if t.description else f"- {t.name}" for t in self.tools)
        self._by_name = {t.name: t for t in self.tools}
        super().__init__(client, store, runtime=runtime, builder=builder, config=config, system_prompt=system_prompt,
                         max_messages=max_messages, max_tokens=max_tokens, token_counter=token_counter,
                         allow_skill_context=allow_skill_context)

    @property
    def tools_schema(self) -> list[dict[str, Any]]:
        """The chat-completions tool schemas of ``tools`` (also what the budget filter counts)."""
        return self._schema

    @property
    def tools_desc(self) -> str:
        """One line per tool, ``- name: description``; ``""`` without tools."""
        return self._desc

    # -- tools ----------------------------------------------------------------------------------

    def _lookup(self, call: dict[str, Any]) -> tuple[Tool, dict[str, Any]]:
        name = call["function"]["name"]
        t = self._by_name.get(name)
        if t is None:
            raise UnknownToolError(f"unknown tool {name!r}; the tools are: {', '.join(self._by_name) or 'none'}")
        return t, parse_arguments(call["function"].get("arguments", ""), "tool_call")

    def _failed(self, call: dict[str, Any], exc: Exception) -> Message:
        logger.warning("tool %r (call %s) raised %s: %s", call["function"]["name"], call["id"],
                       type(exc).__name__, exc, exc_info=not isinstance(exc, UnknownToolError))
        return _error_message(call, exc)

    def _run_tool(self, call: dict[str, Any]) -> Message:
        try:
            t, args = self._lookup(call)
            value = t(**args)
            if inspect.isawaitable(value):
                value = _run_awaitable(value)
        except Exception as exc:
            return self._failed(call, exc)
        return _result_message(call, value)

    async def _arun_tool(self, call: dict[str, Any]) -> Message:
        try:
            t, args = self._lookup(call)
            value = t(**args)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return self._failed(call, exc)
        return _result_message(call, value)

    def _limit(self, last: Message) -> MaxStepsExceededError:
        return MaxStepsExceededError(
            f"AgentLLMNode: the model still called tools after max_steps={self.max_steps} model calls; every step "
            "is stored with its tool results, so update() again continues from there (or raise max_steps)",
            steps=self.max_steps, last=last)

    # -- public ---------------------------------------------------------------------------------

    def update(self, local_state: Any = None, global_state: Any = None, ctx: Any = None) -> Message:
        """Run the tool loop until a reply without tool calls; return that reply."""
        for _ in range(self.max_steps):
            reply = self._invoke(self._build(local_state, global_state, ctx))
            if not reply.tool_calls:
                self.store.append(reply)
                return reply
            results = [self._run_tool(call) for call in reply.tool_calls]
            self.store.extend([reply, *results])
        raise self._limit(reply)

    async def update_async(self, local_state: Any = None, global_state: Any = None, ctx: Any = None) -> Message:
        """``update`` with ``client.ainvoke``; ``async`` tools are awaited, others called directly."""
        for _ in range(self.max_steps):
            reply = await self._ainvoke(self._build(local_state, global_state, ctx))
            if not reply.tool_calls:
                self.store.append(reply)
                return reply
            results = [await self._arun_tool(call) for call in reply.tool_calls]
            self.store.extend([reply, *results])
        raise self._limit(reply)


async def _await(value: Any) -> Any:
    return await value


def _run_awaitable(value: Any) -> Any:
    """Run an ``async`` tool's result from the sync ``update`` (not inside a running loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(value))
    close = getattr(value, "close", None)
    if close is not None:
        close()  # never awaited otherwise: close it instead of leaking a warning
    raise RuntimeError("an async tool cannot run from update() inside a running event loop; use await update_async()")
