#!/usr/bin/env python3
"""By hand: the official openai client (pip install openai) against a running
cluster with the HTTP API, e.g. deploy/examples/local.yaml after
`hpdctl up` (port 17602, the model `tiny`, the key in .hpd/local/client-keys):
models, chat and completions, streamed and not (streamed = unstreamed),
usage, a stop string, logprobs (chat streamed and not, completions with
echo), reasoning, tool calls, n choices, and the 401 / 404 / 400 errors
as the client raises
them. Tooling only (docs/api.md).

  python3 tools/openai_check.py [BASE_URL] [KEY_FILE]
"""
import sys
from openai import OpenAI, APIStatusError
base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:17602/v1"
key = open(sys.argv[2] if len(sys.argv) > 2 else ".hpd/local/client-keys").readline().split()[0]
c = OpenAI(base_url=base, api_key=key)
print("models:", [m.id for m in c.models.list().data])
r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is the capital of France?"}],
                              max_tokens=16, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
print("chat:", repr(r.choices[0].message.content), r.choices[0].finish_reason, r.usage)
pieces = []
usage = None
for ch in c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                    max_tokens=16, stream=True, stream_options={"include_usage": True},
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}}):
    if ch.choices:
        pieces.append(ch.choices[0].delta.content or "")
    if ch.usage:
        usage = ch.usage
print("chat stream:", len(pieces), "chunks ->", repr("".join(pieces)), "same as unstreamed:", "".join(pieces) == r.choices[0].message.content, usage)
cr = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=16)
print("completion:", repr(cr.choices[0].text), cr.choices[0].finish_reason, cr.usage)
s = "".join(ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=16, stream=True))
print("completion stream same:", s == cr.choices[0].text)
st = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=16, stop=[cr.choices[0].text[3:6]])
print("stop:", repr(st.choices[0].text), st.choices[0].finish_reason)
# log probabilities, parsed by the client's types (docs/api.md)
lr = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Name a colour."}],
                               max_tokens=6, logprobs=True, top_logprobs=3,
                               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
lc = lr.choices[0].logprobs.content
print("chat logprobs:", len(lc), "tokens, first", repr(lc[0].token), lc[0].logprob, lc[0].bytes,
      [(t.token, t.logprob) for t in lc[0].top_logprobs])
sl = []
for ch in c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Name a colour."}],
                                    max_tokens=6, logprobs=True, top_logprobs=3, stream=True,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}}):
    if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
        sl.extend(ch.choices[0].logprobs.content)
print("chat logprobs stream same:", [(t.token, t.logprob) for t in sl] == [(t.token, t.logprob) for t in lc])
ce = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=4, logprobs=2, echo=True)
cl = ce.choices[0].logprobs
print("completion echo:", repr(ce.choices[0].text), len(cl.tokens), "tokens, logprobs",
      cl.token_logprobs[:3], "top", cl.top_logprobs[1], "offsets", cl.text_offset[:4])
# reasoning: the model's default thinking on (the answer is reasoning until </think>)
rr = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Why is the sky blue?"}],
                               max_tokens=8)
m = rr.choices[0].message
print("reasoning:", repr(getattr(m, "reasoning_content", None)), "content:", repr(m.content))
# structured outputs (docs/structured_outputs.md): the client's parse helper too
import json as _json
schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}
so = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON"}], max_tokens=300,
                               temperature=1, seed=1,
                               response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
                               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
print("json_schema:", repr(so.choices[0].message.content), so.choices[0].finish_reason,
      "parses:", so.choices[0].finish_reason != "stop" or isinstance(_json.loads(so.choices[0].message.content), dict))
# tool calls: the client's types, streamed and not (docs/api.md, "Tool calls")
tools = [{"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object", "properties": {"hour": {"type": "integer"}, "day": {"enum": ["mon", "tue"]}},
    "required": ["hour", "day"]}}}]
kw = dict(model="tiny", messages=[{"role": "user", "content": "Wake me."}], max_tokens=200, temperature=1,
          seed=3, tools=tools, tool_choice="required",
          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
tr = c.chat.completions.create(**kw)
tc = tr.choices[0].message.tool_calls
print("tool call:", tr.choices[0].finish_reason, [(t.id, t.function.name, t.function.arguments) for t in tc])
acc = {}
for ch in c.chat.completions.create(stream=True, **kw):
    for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
        e = acc.setdefault(d.index, {"name": "", "arguments": ""})
        e["name"] += d.function.name or ""
        e["arguments"] += d.function.arguments or ""
print("tool call stream same:", [(e["name"], e["arguments"]) for e in acc.values()] ==
      [(t.function.name, t.function.arguments) for t in tc])
back = c.chat.completions.create(model="tiny", max_tokens=4, tools=tools, messages=[
    {"role": "user", "content": "Wake me."}, tr.choices[0].message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": tc[0].id, "content": "alarm set"}],
    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
print("tool answer back:", back.choices[0].finish_reason)
# n choices (docs/api.md): each streamed chunk names its choice; joined by
# index they equal the unstreamed choices; tool calls per choice
nk = dict(model="tiny", messages=[{"role": "user", "content": "Name a city."}], max_tokens=12, n=3,
          temperature=1, seed=5, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
nr = c.chat.completions.create(**nk)
got = {}
for ch in c.chat.completions.create(stream=True, **nk):
    for x in ch.choices:
        got[x.index] = got.get(x.index, "") + (x.delta.content or "")
print("n=3:", [x.index for x in nr.choices], "streamed same:",
      [got.get(i) for i in range(3)] == [x.message.content for x in nr.choices], nr.usage)
ntr = c.chat.completions.create(**dict(kw, n=2))
ids = [t.id for x in ntr.choices for t in x.message.tool_calls]
print("n=2 tool calls:", [(x.index, x.finish_reason, [t.function.name for t in x.message.tool_calls]) for x in ntr.choices],
      "ids unique:", len(set(ids)) == len(ids))
for what, fn in [("bad key", lambda: OpenAI(base_url=base, api_key="nope-nope-nope-nope").models.list()),
                 ("unknown model", lambda: c.completions.create(model="gpt-4o", prompt="x", max_tokens=1)),
                 ("n=17", lambda: c.completions.create(model="tiny", prompt="x", max_tokens=1, n=17))]:
    try:
        fn()
        print(what, "NOT refused")
    except APIStatusError as e:
        print(what, "->", type(e).__name__, e.status_code, e.message[:90])
