"""The drop-in promise of CONTRACT.md section 1, as a test: every documented name imports
from its jianmu_fast module and is listed in that module's ``__all__``."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

CONTRACT = {
    "jianmu_fast.message": [
        "Message", "system", "human", "ai", "tool", "StateMessageStore", "StrictMessageCoercer",
        "LenientMessageCoercer", "MaxCountRetention", "MessageEvent", "sanitize_tool_call_history",
        "ToolCallHistoryError",
    ],
    "jianmu_fast.message.store": [
        "StateMessageStore", "StrictMessageCoercer", "LenientMessageCoercer", "MaxCountRetention", "MessageEvent",
    ],
    "jianmu_fast.memory.context": [
        "ContextBuilder", "ContextBuilderProtocol", "MessageProvider", "ContextFilter", "TokenCounterProtocol",
        "StaticPromptProvider", "ToolsDescProvider", "BootstrapFilesProvider", "SkillSetPromptProvider",
        "StateHistoryProvider", "MaxMessagesFilter", "TokenBudgetFilter", "SimpleTokenCounter",
        "TiktokenTokenCounter", "HFTokenCounter", "PromptRuntimeContext", "resolve_for_llm",
    ],
    "jianmu_fast.memory.context.base": [
        "MessageProvider", "ContextFilter", "TokenCounterProtocol", "ContextBuilderProtocol",
    ],
    "jianmu_fast.memory.context.builder": ["ContextBuilder"],
    "jianmu_fast.config.prompts": [
        "persona_default_prompt", "react_protocol_prompt", "history_semantics_prompt",
        "skill_capability_policy_prompt", "skill_on_demand_policy_prompt", "skill_fallback_policy_prompt",
        "skill_resource_usage_policy_prompt",
    ],
    "jianmu_fast.config.constraints": ["Constraints"],
    "jianmu_fast.state": ["StateManager"],
    "jianmu_fast.batch": ["build_batch", "transform_batch"],
    "jianmu_fast.model": ["ModelClient", "OpenAIChatClient", "ModelCallError"],
    "jianmu_fast.nodes": ["SimpleLLMNode", "AgentLLMNode", "Tool"],
    "jianmu_fast": ["BACKEND", "JianmuError", "ContextBudgetError", "ToolCallHistoryError", "TokenizerLoadError"],
}


@pytest.mark.parametrize("module_name", sorted(CONTRACT))
def test_contract_names_are_exported(module_name):
    module = importlib.import_module(module_name)
    missing = [n for n in CONTRACT[module_name] if not hasattr(module, n)]
    assert not missing, f"{module_name} lacks {missing}"
    unlisted = [n for n in CONTRACT[module_name] if n not in getattr(module, "__all__", ())]
    assert not unlisted, f"{module_name}.__all__ lacks {unlisted}"


@pytest.mark.parametrize("module_name", sorted(CONTRACT))
def test_all_lists_only_real_names(module_name):
    module = importlib.import_module(module_name)
    ghosts = [n for n in module.__all__ if not hasattr(module, n)]
    assert not ghosts, f"{module_name}.__all__ names missing attributes {ghosts}"


def test_importing_the_package_loads_no_tokenizer():
    """Heavy imports stay lazy: tiktoken and tokenizers load only when a counter needs them."""
    code = (
        "import sys, jianmu_fast, jianmu_fast.message, jianmu_fast.memory.context; "
        "print(sorted(m for m in ('tiktoken', 'tokenizers', 'transformers', 'langchain_core') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_docs_contract_names_are_all_checked():
    """docs/CONTRACT.md (shipped with the package's sources) and this test agree: every name its
    section 1 table lists for a jianmu_fast module is one the test above checks."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    section = doc.split("## 1.", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `[^`]+` \| `(jianmu_fast[\w.]*)`(?::([^|]*))?", section, re.M)
    assert len(rows) >= 5, rows
    unchecked = {}
    for module, names in rows:
        documented = re.findall(r"`(\w+)`", names or "")
        missing = [n for n in documented if n not in CONTRACT.get(module, [])]
        if missing:
            unchecked[module] = missing
    assert not unchecked, f"names in docs/CONTRACT.md that test_public_api does not check: {unchecked}"
