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
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, today or later.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "a city, \"as written\" — e.g. Zürich"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]}, "ratio": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}}


def call(name, args, i=0):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


# (tools, messages): tool definitions, assistant tool calls (arguments as a
# mapping, as vLLM passes them to templates) and tool messages
TOOL_CASES = [
    ([WEATHER], [U]),
    ([WEATHER, SEARCH], [{"role": "system", "content": "You are terse."}, U]),
    ([WEATHER], [U, {"role": "assistant", "content": "",
                     "tool_calls": [call("get_weather", {"city": "Paris", "days": 2})]},
                 {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"}]),
    ([WEATHER, SEARCH], [U, {"role": "assistant", "content": "Let me check.",
                             "tool_calls": [call("get_weather", {"city": "Zürich \"old\" town", "unit": "celsius"}),
                                            call("search", {"query": "a\nb", "filters": {"year": 2024, "tags": ["x", None, True]}}, 1)]},
                         {"role": "tool", "tool_call_id": "call_0", "content": "rain"},
                         {"role": "tool", "tool_call_id": "call_1", "content": "  [result]  "},
                         {"role": "assistant", "content": "It rains."}, {"role": "user", "content": "Thanks"}]),
    ([SEARCH], [U, {"role": "assistant", "content": "<think>\nneed data\n</think>\n\n",
                    "tool_calls": [call("search", {"query": "capital", "filters": {"ratio": 0.1, "big": 1e20, "small": 1.5e-7, "n": -3, "f": 2.0}})]},
                {"role": "tool", "tool_call_id": "call_0", "content": "Paris"}]),
    (None, [U, {"role": "assistant", "content": "",
                "tool_calls": [call("search", {"query": "q", "flag": False})]},
            {"role": "tool", "tool_call_id": "call_0", "content": "ok"}]),
]

# (add_generation_prompt, enable_thinking: None = not given)
MODES = [(True, None), (True, True), (True, False), (False, None)]


def render(env, tmpl, messages, add, think, tools=None):
    kw = {"messages": messages, "add_generation_prompt": add}
    if tools is not None:
        kw["tools"] = tools
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
    # transformers' tojson (chat_template_utils), not Jinja's HTML-safe,
    # key-sorting one
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
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
        for tools, messages in TOOL_CASES:
            for add, th in MODES[:3]:
                r = render(env, tmpl, messages, add, th, tools)
                case = {"template": name, "think": think, "qwen35": q35, "messages": messages,
                        "tools": tools, "add_generation_prompt": add, "enable_thinking": th}
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
