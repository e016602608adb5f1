#!/usr/bin/env python3
"""Writes tests/tokenizer/chat_expected.json: conversations rendered by the
Qwen family's own Jinja chat templates, as transformers renders them
(jinja2's sandbox, trim_blocks and lstrip_blocks), for test_chat to compare
hybridpd's built-in format with (tokenizer/chat.h).

The official templates are read from llama.cpp's source, which ships them
(models/templates/ of the llama-cpp-python sdist's vendor/llama.cpp):

  python3 tools/chat_fixture.py --templates DIR/models/templates \\
      --mkmodel-config models/tiny/tokenizer_config.json \\
      --out tests/tokenizer/chat_expected.json

Needs jinja2 (pip install jinja2). Tooling only, not a runtime dependency.
"""
import argparse
import json

from jinja2.sandbox import ImmutableSandboxedEnvironment

# name -> (file, hybridpd's format: think, qwen35)
TEMPLATES = {
    "qwen3.5": ("Qwen3.5-4B.jinja", "default", True),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "switch", False),
}

U = {"role": "user", "content": "What is the capital of France?"}
CASES = [
    [U],
    [{"role": "system", "content": "You are terse."}, U],
    [{"role": "system", "content": "  Padded system.\n\n"}, {"role": "user", "content": "\n hi \t"}],
    [U, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Spain?"}],
    [U, {"role": "assistant", "content": "<think>\nThe user asks.\n</think>\n\nParis."},
     {"role": "user", "content": "And Spain?"}],
    [U, {"role": "assistant", "content": "Paris.", "reasoning_content": "\nEasy one.\n"},
     {"role": "user", "content": "And Spain?"}],
    # an assistant turn after the last query (a prefill of the answer)
    [U, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nParis"}],
    [U, {"role": "assistant", "content": "Paris"}],
    [U, {"role": "assistant", "content": "a</think>b</think>\n\nc"}],
    [{"role": "user", "content": "Grüße 你好 👩‍👩‍👧 e\u0301\u3000"}],
    [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}, U,
     {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
     {"role": "user", "content": "<tool_response>42</tool_response>"}],
    [{"role": "user", "content": ""}],
    [{"role": "assistant", "content": "Hello."}, U],
    # refused by Qwen3.5's template: no query, a late system message
    [{"role": "user", "content": "<tool_response>x</tool_response>"}],
    [U, {"role": "system", "content": "late"}],
]
# (add_generation_prompt, enable_thinking: None = not given)
MODES = [(True, None), (True, True), (True, False), (False, None)]


def render(env, tmpl, messages, add, think):
    kw = {"messages": messages, "add_generation_prompt": add}
    if think is not None:
        kw["enable_thinking"] = think
    try:
        return env.from_string(tmpl).render(**kw)
    except Exception as e:  # raise_exception: the template refuses it
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", required=True)
    ap.add_argument("--mkmodel-config", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    def fail(msg):
        raise RuntimeError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = fail
    tmpls = {name: (open(f"{a.templates}/{f}").read(), think, q35)
             for name, (f, think, q35) in TEMPLATES.items()}
    with open(a.mkmodel_config) as f:
        tmpls["hpd-mkmodel"] = (json.load(f)["chat_template"], "default", True)
    out = []
    for name, (tmpl, think, q35) in tmpls.items():
        for messages in CASES:
            for add, th in MODES:
                r = render(env, tmpl, messages, add, th)
                case = {"template": name, "think": think, "qwen35": q35, "messages": messages,
                        "add_generation_prompt": add, "enable_thinking": th}
                if isinstance(r, dict):
                    case["error"] = r["error"]
                else:
                    case["text"] = r
                out.append(case)
    with open(a.out, "w") as f:
        json.dump({"note": "written by tools/chat_fixture.py",
                   "mkmodel_template": tmpls["hpd-mkmodel"][0], "cases": out}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} cases -> {a.out}")


if __name__ == "__main__":
    main()
