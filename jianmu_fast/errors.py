"""The one error hierarchy of jianmu_fast.

::

    JianmuError
      ├─ MessageValidationError(JianmuError, ValueError)   bad message input, with its path
      ├─ ContextBudgetError(JianmuError, ValueError)       the newest turn cannot fit the limit
      ├─ ToolCallHistoryError(JianmuError, ValueError)     a broken tool-call transaction at the tail
      ├─ ConfigError(JianmuError, ValueError)              a malformed jianmu.yaml or SKILL.md
      ├─ TokenizerLoadError(JianmuError, OSError)          an encoding or tokenizer.json cannot load
      ├─ BatchError(JianmuError, ValueError)               a state of a batch failed (index, cause)
      ├─ StateStoreError(JianmuError, OSError)             a state database cannot be opened, read or written
      ├─ ModelCallError(JianmuError, RuntimeError)         a model call failed (status, body excerpt)
      └─ MaxStepsExceededError(JianmuError, RuntimeError)  an agent still calls tools after max_steps

Each error also subclasses the builtin a user already catches. Every message says what is
wrong, where (message index, field, file path) and how to fix it.

Errors of this hierarchy protect the contract's invariants: the pipeline's error isolation
(a failing provider or filter is logged and skipped) never swallows them.
"""

from __future__ import annotations

__all__ = [
    "JianmuError",
    "MessageValidationError",
    "ContextBudgetError",
    "ToolCallHistoryError",
    "TrimmingError",
    "ConfigError",
    "TokenizerLoadError",
    "BatchError",
    "StateStoreError",
    "ModelCallError",
    "MaxStepsExceededError",
]


class JianmuError(Exception):
    """Base class of every error jianmu_fast raises on purpose."""


class MessageValidationError(JianmuError, ValueError):
    """A message (or a list of them) is malformed; the text names the index and the field."""


class ContextBudgetError(JianmuError, ValueError):
    """A filter cannot keep the newest unit beside the pinned prefix within its limit.

    Attributes: ``budget`` (the limit), ``pinned`` (what the pinned prefix needs),
    ``newest`` (what the newest unit needs), in the filter's unit (tokens or messages).
    """

    def __init__(self, message: str, *, budget: int = 0, pinned: int = 0, newest: int = 0) -> None:
        super().__init__(message)
        self.budget = budget
        self.pinned = pinned
        self.newest = newest

    def __reduce__(self):  # keep the attributes across process boundaries (batch workers)
        return (_rebuild_budget_error, (self.args[0], self.budget, self.pinned, self.newest))


def _rebuild_budget_error(message: str, budget: int, pinned: int, newest: int) -> ContextBudgetError:
    return ContextBudgetError(message, budget=budget, pinned=pinned, newest=newest)


class ToolCallHistoryError(JianmuError, ValueError):
    """The newest tool-call transaction is broken, so the request would be invalid."""


class TrimmingError(JianmuError, ValueError):
    """A built-in trimming filter could not decide: its token counter raised, or returned a
    count that is not an int between 0 and 2**53. The text names the filter, the counter and
    the message index; the original error, if any, is chained. Never caught by the builder's
    error isolation: sending the untrimmed prompt instead could exceed the budget."""


class ConfigError(JianmuError, ValueError):
    """A configuration or skill file is malformed; the text names the file and line."""


class TokenizerLoadError(JianmuError, OSError):
    """An encoding or tokenizer file cannot be loaded; the text says where it looked."""


class BatchError(JianmuError, ValueError):
    """One state of a batch (``jianmu_fast.batch``) failed under ``on_error="raise"``.

    Attributes: ``index`` (the state's position in the batch) and ``error`` (what
    ``builder.build(state)`` raised for it, also chained as ``__cause__``).
    """

    def __init__(self, message: str, *, index: int = -1, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.error = error

    def __reduce__(self):  # keep the attributes across process boundaries
        return (_rebuild_batch_error, (self.args[0], self.index, self.error))


def _rebuild_batch_error(message: str, index: int, error: BaseException | None) -> "BatchError":
    return BatchError(message, index=index, error=error)


class StateStoreError(JianmuError, OSError):
    """A state database cannot be opened, read or written: not a jianmu_fast state file (random
    bytes, a device, another application's SQLite database), a newer schema version, a corrupt
    record or page, a read-only file or directory, a lock held too long. The text names the
    file (and the key), the operation and the cause; the ``sqlite3`` error, if any, is chained.
    The file is never overwritten, and a write that fails leaves it exactly as it was."""


class ModelCallError(JianmuError, RuntimeError):
    """A model call failed: an HTTP error status after the retries, a timeout or connection
    error (``status`` is ``None``), or a reply that cannot be stored (malformed tool calls).

    Attributes: ``status`` (HTTP status or ``None``), ``body`` (the first 500 characters of
    the response body, ``""`` when there was none), ``attempts`` (requests made).
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = "", attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.attempts = attempts

    def __reduce__(self):  # keep the attributes across process boundaries
        return (_rebuild_model_call_error, (self.args[0], self.status, self.body, self.attempts))


def _rebuild_model_call_error(message: str, status: int | None, body: str, attempts: int) -> "ModelCallError":
    return ModelCallError(message, status=status, body=body, attempts=attempts)


class MaxStepsExceededError(JianmuError, RuntimeError):
    """``AgentLLMNode`` made ``max_steps`` model calls and the last reply still called tools.

    The store holds every completed step (each reply with all its tool results), so the
    history is valid and a later ``update()`` continues from it. Attributes: ``steps`` and
    ``last`` (the last assistant message, already stored with its results).
    """

    def __init__(self, message: str, *, steps: int = 0, last: object = None) -> None:
        super().__init__(message)
        self.steps = steps
        self.last = last
