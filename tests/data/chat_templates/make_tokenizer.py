"""The tokenizer the chat-template tests share, and the model folders they build from it.

``cl100k_base.tokenizer.json.gz`` is tiktoken's cl100k_base (shipped in jianmu_fast/_data, MIT)
converted to a HuggingFace byte-level BPE ``tokenizer.json`` by transformers'
``TikTokenConverter`` (the conversion transformers applies to tiktoken-based models such as
Llama 3), with the regex transformers uses for them. Rebuild it from the repository root with::

    .venv/bin/python tests/data/chat_templates/make_tokenizer.py

``model_dir(family, dest)`` writes a model folder for one family of this directory: its
``tokenizer_config.json`` (its ``tokenizer_class`` set to ``PreTrainedTokenizerFast``) and chat
template, and a ``tokenizer.json`` made of the shared vocabulary plus the family's added tokens
(from ``added_tokens_decoder``, special or not).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("qwen3", "hermes", "llama3.1", "mistral", "deepseek-v3", "gpt-oss")
_BASE: dict[str, str] = {}


def base_tokenizer_json() -> str:
    if "s" not in _BASE:
        with gzip.open(os.path.join(HERE, "cl100k_base.tokenizer.json.gz"), "rt", encoding="utf-8") as f:
            _BASE["s"] = f.read()
    return _BASE["s"]


def model_dir(family: str, dest: str) -> str:
    """Write the model folder of ``family`` into ``dest`` (created) and return ``dest``."""
    from tokenizers import AddedToken, Tokenizer

    src = os.path.join(HERE, family)
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), os.path.join(dest, name))
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    tok = Tokenizer.from_str(base_tokenizer_json())
    entries = sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0]))
    special = [AddedToken(v["content"], normalized=False, special=True) for _, v in entries if v.get("special")]
    plain = [AddedToken(v["content"], normalized=False, special=False) for _, v in entries if not v.get("special")]
    tok.add_special_tokens(special)
    tok.add_tokens(plain)
    tok.save(os.path.join(dest, "tokenizer.json"))
    # the shared vocabulary is no family's own: transformers must load tokenizer.json as it is
    # (Qwen2Tokenizer would rebuild Qwen's pre-tokenizer around it)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(os.path.join(dest, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return dest


#: Hermes 2 Pro's default template (plain ChatML; its tokenizer_config names the Hermes tool
#: template, ``hermes/chat_template.jinja``, "tool_use" beside it), written by us
CHATML = ("{{bos_token}}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def named_model_dir(dest: str, layout: str = "config") -> str:
    """A model folder with two named chat templates, as Hermes 2 Pro ships them: "default"
    (``CHATML``) and "tool_use" (the Hermes tool template), which transformers renders a
    request with tools by. ``layout``: "config" (a list of ``{"name", "template"}`` in
    ``tokenizer_config.json``) or "files" (``chat_template.jinja`` and
    ``additional_chat_templates/tool_use.jinja``, as transformers 5 saves them)."""
    model_dir("hermes", dest)
    jinja = os.path.join(dest, "chat_template.jinja")
    with open(jinja, encoding="utf-8") as f:
        tool_use = f.read()
    if layout == "files":
        with open(jinja, "w", encoding="utf-8") as f:
            f.write(CHATML)
        os.makedirs(os.path.join(dest, "additional_chat_templates"), exist_ok=True)
        with open(os.path.join(dest, "additional_chat_templates", "tool_use.jinja"), "w", encoding="utf-8") as f:
            f.write(tool_use)
        return dest
    os.remove(jinja)
    cfg = os.path.join(dest, "tokenizer_config.json")
    with open(cfg, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": tool_use}]
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return dest


def main() -> None:
    import tempfile

    from transformers.convert_slow_tokenizer import TikTokenConverter

    src = os.path.join(HERE, "..", "..", "..", "jianmu_fast", "_data", "cl100k_base.tiktoken.gz")
    with gzip.open(src, "rb") as f, tempfile.NamedTemporaryFile(suffix=".tiktoken", delete=False) as out:
        out.write(f.read())
    tok = TikTokenConverter(vocab_file=out.name).converted()
    os.unlink(out.name)
    with gzip.open(os.path.join(HERE, "cl100k_base.tokenizer.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(tok.to_str())


if __name__ == "__main__":
    main()
