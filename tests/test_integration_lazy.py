"""The integrations import their frameworks only when used, and name the extra when one is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ("langchain_core", "langgraph", "agents", "anthropic", "openai")


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_every_integration_imports_no_framework():
    out = run("import sys\n"
              "import jianmu_fast.integrations.langchain, jianmu_fast.integrations.openai_agents\n"
              "import jianmu_fast.integrations.anthropic, jianmu_fast.integrations.openai_responses\n"
              f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    assert out == "[]"


@pytest.mark.parametrize("blocked, call, extra", [
    ("langchain_core.messages", "m.to_langchain([{'role': 'user', 'content': 'x'}])", "langchain"),
    ("agents.run_config", "m.call_model_input_filter(ContextBuilder())(None)", "agents"),
])
def test_a_missing_framework_names_its_extra(blocked, call, extra):
    module = "langchain" if extra == "langchain" else "openai_agents"
    out = run("import sys\n"
              f"import jianmu_fast.integrations.{module} as m\n"
              "from jianmu_fast.memory.context import ContextBuilder\n"
              f"sys.modules[{blocked!r}] = None\n"
              f"try:\n    {call}\nexcept ImportError as e:\n    print(e)\n")
    assert f"pip install 'jianmu_fast[{extra}]'" in out


def test_anthropic_validation_names_its_extra_and_the_path():
    from jianmu_fast.errors import MessageValidationError
    from jianmu_fast.integrations.anthropic import validate_anthropic

    with pytest.raises(MessageValidationError, match=r"messages\[1\]"):
        validate_anthropic({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 3}]})
    with pytest.raises(MessageValidationError, match="messages: field required"):
        validate_anthropic({"system": "s"})
    out = run("import sys\nfrom jianmu_fast.integrations.anthropic import validate_anthropic\n"
              "sys.modules['anthropic.types'] = None\n"
              "try:\n    validate_anthropic({'messages': []})\nexcept ImportError as e:\n    print(e)\n")
    assert "pip install 'jianmu_fast[anthropic]'" in out
