#!/usr/bin/env python3
"""Mutation testing of one module: the body of scripts/mutation.sh.

Copies the source tree into a scratch directory and builds it once; lets
universalmutator (`mutate`, PyPI) write every mutant of the module's source
files, draws a seeded sample of them, and for each mutant writes it over the
file, rebuilds the module's unit tests, runs them under a time limit and puts
the original back. Prints one line per mutant, the mutation score and the
surviving mutants. A tool run by hand (docs/testing.md), not part of CI.

Only the scratch copy is ever written; the tree it was copied from is read.
"""

import argparse
import difflib
import glob
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Each module: its source files, the .c files of its folders left out (and
# why), its unit tests (ctest names, which are also the build targets, but
# for those in "runs_of": the test whose binary they run) and the programs
# those tests start (checked for relinking like the tests).
MODULES = {
    "kernels/cpu": {
        "files": ["kernels/cpu/attention.c", "kernels/cpu/conv1d.c",
                  "kernels/cpu/cpu_backend.c", "kernels/cpu/elementwise.c",
                  "kernels/cpu/gdn.c", "kernels/cpu/gemm.c", "kernels/cpu/gemm_bf16.c",
                  "kernels/cpu/norm.c",
                  "kernels/cpu/sample.c", "kernels/cpu/translate.c"],
        "left_out": {"kernels/cpu/moe.c": "the moe module's (test_moe_route)"},
        "tests": ["test_gemm", "test_ops", "test_gdn", "test_attention",
                  "test_sample", "test_translate"],
    },
    "cache": {
        "files": ["common/kv_layout.c", "cache/page_pool.c", "cache/slot_pool.c",
                  "cache/prefix_cache.c", "cache/prefix_hash.c"],
        "left_out": {},
        "tests": ["test_pools", "test_prefix_cache", "test_cache_alloc_failures"],
    },
    "transport": {
        "files": ["transport/rpc_codec.c", "transport/rpc_conn.c",
                  "transport/rpc_server.c", "transport/rpc_client.c",
                  "transport/xfer.c", "transport/xfer_send.c", "transport/xfer_recv.c",
                  "transport/xfer_info.c", "node/kv_push.c"],
        "left_out": {"transport/http.c": "the HTTP front end, not codec/rpc/xfer",
                     "transport/xfer_nccl.c": "needs CUDA, NCCL and a GPU"},
        "tests": ["test_rpc_codec", "test_rpc", "test_rpc_local", "fuzz_rpc_codec_replay",
                  "test_xfer", "test_xfer_local"],
    },
    "control": {
        "files": ["node/msg.c", "node/liveness.c", "coordinator/routing.c",
                  "coordinator/request.c", "coordinator/admission.c",
                  "coordinator/credentials.c", "prefill_node/staging.c",
                  "prefill_node/peers.c", "decode_node/join.c", "decode_node/writes.c"],
        "left_out": {"node/node.c": "the node module's",
                     "node/proto.c": "the node module's",
                     "coordinator/coord.c": "the coordinator module's",
                     "coordinator/registry.c": "the coordinator module's",
                     "coordinator/msgdoor.c": "the coordinator module's",
                     "coordinator/alive.c": "the coordinator module's",
                     "coordinator/breaker.c": "the coordinator module's",
                     "coordinator/main.c": "options and the service shell: the cluster tests",
                     "service/service.c": "signals and the drain: the cluster tests",
                     "prefill_node/prefill.c": "the prefill_node module's",
                     "prefill_node/main.c": "one call",
                     "decode_node/decode.c": "the decode_node module's",
                     "decode_node/main.c": "one call"},
        "tests": ["test_msg", "test_liveness", "fuzz_msg_replay", "test_routing", "test_request",
                  "test_admission", "test_credentials", "test_staging", "test_peers",
                  "test_writes", "test_join"],
    },
    "text": {
        "files": ["tokenizer/tokenizer.c", "tokenizer/train.c"],
        "left_out": {},
        "tests": ["test_tokenizer"],
    },
    # The coordinator's own event handling, with its scripted peers
    # (tests/coordinator/peers.h: fake nodes in process, no cluster), and the
    # failure detector and breaker it judges nodes with.
    "coordinator": {
        "files": ["coordinator/coord.c", "coordinator/registry.c", "coordinator/msgdoor.c",
                  "coordinator/alive.c", "coordinator/breaker.c"],
        "left_out": {"coordinator/main.c": "options and the service shell: the cluster tests",
                     "coordinator/openai.c": "the api module's",
                     "coordinator/text.c": "the chat module's",
                     "coordinator/routing.c": "the control module's",
                     "coordinator/request.c": "the control module's",
                     "coordinator/admission.c": "the control module's",
                     "coordinator/credentials.c": "the control module's"},
        "tests": ["test_coord", "test_alive", "test_breaker"],
    },
    "chat": {
        "files": ["tokenizer/chat.c", "coordinator/text.c"],
        "left_out": {},
        "tests": ["test_chat", "test_text"],
    },
    "api": {
        "files": ["coordinator/openai.c"],
        "left_out": {},
        "tests": ["test_http"],
        "programs": ["coordinator/hpd-coordinator"],
    },
    "moe": {
        "files": ["kernels/moe_route.c", "kernels/cpu/moe.c"],
        "left_out": {},
        "tests": ["test_moe_route"],
    },
    # Tensor parallelism's canonical reduction (docs/tensor_parallel.md).
    "tp": {
        "files": ["kernels/tp_sum.c", "engine/tp.c"],
        "left_out": {},
        "tests": ["test_tp_sum", "test_engine_tp"],
    },
    # A thinking model's answer split into reasoning and content.
    "reasoning": {
        "files": ["coordinator/reasoning.c"],
        "left_out": {},
        "tests": ["test_reasoning"],
    },
    # Log probabilities: their computation and wire form (common/logprobs.h).
    "logprobs": {
        "files": ["common/logprobs.c"],
        "left_out": {},
        "tests": ["test_engine", "test_logprobs"],
    },
    # Structured outputs: the schema compiler, patterns, the matcher and
    # the masks (docs/structured_outputs.md).
    "grammar": {
        "files": ["grammar/schema.c", "grammar/regex.c", "grammar/matcher.c", "grammar/mask.c"],
        "left_out": {},
        "tests": ["test_grammar"],
    },
    # One answer's text through its stages, for both doors (coordinator/answer.h).
    "answer": {
        "files": ["coordinator/answer.c"],
        "left_out": {},
        "tests": ["test_answer"],
    },
    # Tool calls parsed from a chat answer (coordinator/toolcall.h).
    "toolcall": {
        "files": ["coordinator/toolcall.c"],
        "left_out": {},
        "tests": ["test_toolcall"],
    },
    # What each prefill rank sends each decode rank (node/tp_plan.h).
    # A chat request's messages and tools for both doors (coordinator/chatreq.h):
    # the msgpack door in process, the HTTP door through a cluster.
    "chatreq": {
        "files": ["coordinator/chatreq.c"],
        "left_out": {},
        "tests": ["test_coord", "test_http"],
    },
    "tp_plan": {
        "files": ["node/tp_plan.c"],
        "left_out": {},
        "tests": ["test_tp_plan"],
    },
    # The CUDA kernels as the host stand-in runs them (tests/kernels/cuda_host:
    # launch.cmake rewrites a .cu file into <name>_host.cpp, compiled into
    # each stand-in test that names it): a mutant of gemm.cu rebuilds and
    # runs test_gemm_cuda_host and test_moe_cuda_host, and so on. Code the
    # stand-in does not reach (a __CUDA_ARCH__ branch) compiles to the same
    # objects: "equivalent" there means "not tested on the host". Its files
    # and tests are those of "stand_in" (filled in below).
    "kernels/cuda": {
        "left_out": {"kernels/cuda/cuda_backend.cu": "the backend's glue: the GPU tests"},
        "stand_in": {"kernels/cuda/gemm.cu": ["test_gemm_cuda_host", "test_moe_cuda_host"],
                     "kernels/cuda/gdn.cu": ["test_gdn_cuda_host"],
                     "kernels/cuda/attention.cu": ["test_attention_cuda_host"],
                     "kernels/cuda/sample.cu": ["test_sample_cuda_host"],
                     "kernels/cuda/checksum.cu": ["test_checksum_cuda_host"],
                     "kernels/cuda/norm.cu": ["test_norm_cuda_host"],
                     "kernels/cuda/elementwise.cu": ["test_norm_cuda_host"],
                     "kernels/cuda/moe.cu": ["test_moe_cuda_host"],
                     "kernels/cuda/translate.cu": ["test_translate_cuda_host"],
                     "kernels/cuda/conv1d.cu": ["test_conv1d_cuda_host"]},
    },
    # The readers of peer and user input (every field of every message goes
    # through them: bounds, kinds, the layout, sampling) against the message
    # tests and the fuzz corpus replay, and the node runtime (registration,
    # heartbeats, stats, the coordinator's loss) against the roles' tests.
    "node": {
        "files": ["node/proto.c", "node/node.c"],
        "left_out": {"node/msg.c": "the control module's",
                     "node/liveness.c": "the control module's"},
        "tests": ["test_proto", "test_msg", "fuzz_msg_replay", "test_prefill", "test_decode"],
        "programs": ["prefill_node/hpd-prefill", "decode_node/hpd-decode"],
    },
    # Each node role alone: real hpd-prefill and hpd-decode processes with
    # the test as their coordinator (tests/node/roles.h).
    "prefill_node": {
        "files": ["prefill_node/prefill.c"],
        "left_out": {"prefill_node/staging.c": "the control module's",
                     "prefill_node/peers.c": "the control module's",
                     "prefill_node/main.c": "one call"},
        "tests": ["test_prefill"],
        "programs": ["prefill_node/hpd-prefill"],
    },
    "decode_node": {
        "files": ["decode_node/decode.c"],
        "left_out": {"decode_node/join.c": "the control module's",
                     "decode_node/writes.c": "the control module's",
                     "decode_node/main.c": "one call"},
        "tests": ["test_decode"],
        "programs": ["decode_node/hpd-decode"],
    },
    # The engine on the CPU backend with the generated tiny models
    # (tests/engine/fixture.h): its scheduler, the forward pass over the
    # hybrid layers, prefix-cache reuse and the disaggregated halves.
    # test_hf_reference: the forward pass against transformers' logits (a
    # final norm skipped changes no greedy token of the tiny models); the
    # _moe runs: the same binaries on a mixture of experts ("runs_of").
    "engine": {
        "files": ["engine/engine.c", "engine/scheduler.c", "engine/forward.c"],
        "left_out": {},
        "tests": ["test_engine", "test_engine_steps", "test_engine_prefix",
                  "test_engine_disagg", "test_hf_reference", "test_engine_tp", "test_engine_moe",
                  "test_engine_prefix_moe", "test_engine_disagg_moe"],
        "runs_of": {"test_engine_moe": "test_engine",
                    "test_engine_prefix_moe": "test_engine_prefix",
                    "test_engine_disagg_moe": "test_engine_disagg"},
    },
    "model": {
        "files": ["model/config.c", "model/safetensors.c", "model/model.c", "model/shard.c"],
        "left_out": {},
        "tests": ["test_config", "test_safetensors", "test_model", "test_shard", "test_engine_tp"],
    },
    "deploy": {
        "files": ["deploy/manifest.c", "deploy/render.c"],
        "left_out": {"deploy/hpdctl.c": "the command line and process control: test_hpdctl "
                                        "and the quick start run it"},
        "tests": ["test_manifest", "test_hpdctl"],
        "programs": ["deploy/hpdctl"],
    },
    "common": {
        "files": ["common/status.c", "common/log.c", "common/dtype.c",
                  "common/util.c", "common/metrics.c"],
        "left_out": {},
        "tests": ["test_util", "test_metrics", "test_log"],
    },
}
for _m in MODULES.values():
    if "stand_in" in _m:
        _m["files"] = list(_m["stand_in"])
        _m["tests"] = list(dict.fromkeys(t for ts in _m["stand_in"].values() for t in ts))

# Lines inside these calls are not mutated: HPD_ASSERT is compiled out of the
# Release build (every mutant of it is equivalent), and log calls only format
# a message (--with-logs mutates them too).
ASSERT_CALL = r"HPD_ASSERT"
LOG_CALL = r"HPD_LOGR?(?:_[A-Z]+)?"

# The scratch build: Release like scripts/build.sh (HPD_ASSERT off,
# HPD_ASSERT_ALWAYS on); no benchmarks and no CUDA, which none of these
# modules' unit tests need.
CMAKE_ARGS = ["-G", "Unix Makefiles", "-DCMAKE_BUILD_TYPE=Release",
              "-DHPD_BUILD_BENCH=OFF", "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON"]
# --sanitize: the same with AddressSanitizer (leaks included) and UBSan, which
# scripts/test.sh's second build runs
SANITIZE_ARGS = {False: ["-DHPD_ASAN=OFF", "-DHPD_UBSAN=OFF"],
                 True: ["-DHPD_ASAN=ON", "-DHPD_UBSAN=ON"]}

INSTALL_HINT = """\
universalmutator's `mutate` was not found (looked at $MUTATE, then PATH).
Install it into a virtual environment and point MUTATE at it:
    python3 -m venv ~/.venvs/mutenv
    ~/.venvs/mutenv/bin/pip install universalmutator
    export MUTATE=~/.venvs/mutenv/bin/mutate"""

USAGE_EPILOG = """\
modules and their unit tests:
""" + "\n".join("  %-12s %s" % (m, " ".join(d["tests"])) for m, d in MODULES.items()) + """

outcomes: KILLED (a test failed), TIMEOUT (ran past the limit; counts as
killed), SURVIVED, INVALID (does not build; not scored), EQUIVALENT (compiles
to the same object code as the original; not scored).
score = killed / (killed + survived)

The scratch directory keeps report.txt, results.tsv and survivors.txt (each
survivor as a patch against the source); without --keep its copy of the tree,
its build and the mutant cache are removed at the end.

examples:
  scripts/mutation.sh cache                   # 80 mutants, seed 1
  scripts/mutation.sh transport 200 --seed 7 --keep
  scripts/mutation.sh cache --only 3f2a9c1e   # rerun one survivor (its id)
"""


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


# ------------------------------------------------------------ output

class Report:
    """Prints to the terminal and to report.txt."""

    def __init__(self):
        self.file = None

    def open(self, path):
        self.file = open(path, "w")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


say = Report()


def die(msg, code=2):
    print("mutation.sh: " + msg, file=sys.stderr)
    sys.exit(code)


# ------------------------------------------------------------ the scratch tree

def source_files(src):
    """The files to copy: git's tracked and untracked-but-not-ignored files
    of a work tree (uncommitted changes included), else every file but
    .git/ and build*/."""
    if os.path.exists(os.path.join(src, ".git")):
        out = subprocess.run(["git", "-C", src, "ls-files", "-co", "--exclude-standard", "-z"],
                             check=True, stdout=subprocess.PIPE).stdout.decode()
        return sorted(f for f in set(out.split("\0")) if f and os.path.lexists(os.path.join(src, f)))
    files = []
    for root, dirs, names in os.walk(src):
        rel_root = os.path.relpath(root, src)
        dirs[:] = sorted(d for d in dirs if d != ".git" and not (rel_root == "." and d.startswith("build")))
        files += [os.path.normpath(os.path.join(rel_root, n)) for n in names]
    return sorted(files)


def sync_tree(src, dst):
    """Makes dst a copy of src's files, writing only those that differ, so a
    reused scratch build rebuilds only what changed."""
    files = source_files(src)
    wanted = set(files)
    changed = 0
    for rel in files:
        s, d = os.path.join(src, rel), os.path.join(dst, rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if os.path.islink(s):
            target = os.readlink(s)
            if not (os.path.islink(d) and os.readlink(d) == target):
                if os.path.lexists(d):
                    os.remove(d)
                os.symlink(target, d)
                changed += 1
            continue
        with open(s, "rb") as f:
            data = f.read()
        if os.path.isfile(d) and not os.path.islink(d):
            with open(d, "rb") as f:
                if f.read() == data:
                    continue
        elif os.path.lexists(d):
            os.remove(d)
        with open(d, "wb") as f:
            f.write(data)
        shutil.copymode(s, d)
        changed += 1
    for root, _, names in os.walk(dst):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), dst)
            if rel not in wanted:
                os.remove(os.path.join(root, n))
    return len(files), changed


# ------------------------------------------------------------ C text

def strip_comments(text):
    """Replaces each comment by a space, keeping the line structure, and
    trims trailing blanks: universalmutator skips every line holding "/*",
    which would leave code with a trailing comment unmutated."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif c in "\"'":
            j = skip_literal(text, i)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "\n".join(line.rstrip() for line in "".join(out).split("\n"))


def skip_literal(text, i):
    """The index after the string or character literal starting at i."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    return min(j + 1, n)


def call_lines(text, name_re):
    """0-based numbers of the lines covered by calls NAME(...) in text."""
    lines = set()
    for m in re.finditer(r"\b(?:%s)\s*\(" % name_re, text):
        i, depth = m.end() - 1, 0
        while i < len(text):
            c = text[i]
            if c in "\"'":
                i = skip_literal(text, i)
                continue
            depth += (c == "(") - (c == ")")
            if depth == 0:
                break
            i += 1
        lines.update(range(text.count("\n", 0, m.start()), text.count("\n", 0, i) + 1))
    return lines


def localize(a, b):
    """The one change from line list a to b: (start, end, new) such that
    b == a[:start] + new + a[end:]. A pure insertion is widened to the line
    before it, so every change names the line the rule rewrote."""
    p = 0
    while p < len(a) and p < len(b) and a[p] == b[p]:
        p += 1
    s = 0
    while s < len(a) - p and s < len(b) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    start, end, new = p, len(a) - s, b[p:len(b) - s]
    if start == end and start > 0:
        start -= 1
        new = [a[start]] + new
    return start, end, new


def show(lines):
    return " \\n ".join(line.strip() for line in lines) if lines else "(nothing)"


# ------------------------------------------------------------ mutants

def mutate_version(mutate):
    real = os.path.realpath(mutate)
    st = os.stat(real)
    return "%s:%d:%d" % (real, st.st_size, int(st.st_mtime))


def mutants_of(mutate, rel, stripped, cache_dir):
    """All mutants universalmutator's C rules write for one file, as
    (start, end, new lines) of the comment-free text; cached per text."""
    key = hashlib.sha256((mutate_version(mutate) + "\0" + stripped).encode()).hexdigest()
    slug = rel.replace("/", "__")
    cache = os.path.join(cache_dir, slug + ".json")
    if os.path.exists(cache):
        with open(cache) as f:
            data = json.load(f)
        if data.get("key") == key:
            return data["raw"], [tuple(m) for m in data["mutants"]]
    work = tempfile.mkdtemp(prefix=slug + ".", dir=cache_dir)
    try:
        base = os.path.basename(rel)
        with open(os.path.join(work, base), "w") as f:
            f.write(stripped)
        out_dir = os.path.join(work, "out")
        os.mkdir(out_dir)
        with open(os.path.join(cache_dir, slug + ".mutate.log"), "w") as log:
            r = subprocess.run([mutate, base, "c", "--noCheck", "--mutantDir", out_dir],
                               cwd=work, stdout=log, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            die("mutate failed on %s (see %s)" % (rel, log.name))
        a = stripped.split("\n")
        mutants = []
        names = os.listdir(out_dir)
        for name in names:
            with open(os.path.join(out_dir, name)) as f:
                b = f.read().split("\n")
            if b != a:
                mutants.append(localize(a, b))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mutants.sort(key=lambda m: (m[0], m[1], m[2]))
    with open(cache, "w") as f:
        json.dump({"key": key, "raw": len(names), "mutants": mutants}, f)
    return len(names), mutants


class Mutant:
    def __init__(self, rel, start, end, new, stripped_lines):
        self.rel, self.start, self.end, self.new = rel, start, end, list(new)
        # the id names the change by its text, not its line number, so it
        # survives edits elsewhere in the file; the nth same change in the
        # file gets #n
        self.key = "%s\0%s\0%s" % (rel, "\n".join(stripped_lines[start:end]), "\n".join(new))
        self.id = None
        self.outcome, self.secs, self.note = None, 0.0, ""

    def set_id(self, nth):
        self.id = hashlib.sha1(("%s\0%d" % (self.key, nth)).encode()).hexdigest()[:8]

    def line(self):
        return self.start + 1

    def describe(self, stripped_lines):
        return "%s:%d: %s  =>  %s" % (self.rel, self.line(),
                                      show(stripped_lines[self.start:self.end]), show(self.new))

    def text(self, stripped_lines):
        return "\n".join(stripped_lines[:self.start] + self.new + stripped_lines[self.end:])

    def patch(self, original):
        a = original.split("\n")
        b = a[:self.start] + self.new + a[self.end:]
        return "\n".join(difflib.unified_diff(a, b, "a/" + self.rel, "b/" + self.rel,
                                              n=2, lineterm=""))


# ------------------------------------------------------------ build and test

def run_logged(cmd, log_path, cwd=None, timeout=None, append=False):
    with open(log_path, "a" if append else "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    return r.returncode


def first_error(log_path, src_root):
    with open(log_path, errors="replace") as f:
        for line in f:
            if "error" in line.lower() and not line.startswith("$ "):
                return line.strip().replace(src_root + "/", "")[:200]
    return "build failed"


def cmake_dir_of(src_root, rel):
    """The folder whose CMakeLists.txt compiles rel, and rel within it."""
    d = os.path.dirname(rel)
    while d and not os.path.exists(os.path.join(src_root, d, "CMakeLists.txt")):
        d = os.path.dirname(d)
    return d, os.path.relpath(rel, d) if d else rel


def object_of(build, src_root, rel, stand_in):
    """The object files built from rel: one for a C file; for a .cu file of
    the stand-in, its <name>_host.cpp's object in each test that links it."""
    if stand_in:
        name = os.path.splitext(os.path.basename(rel))[0] + "_host.cpp.o"
        hits = sorted(glob.glob(os.path.join(build, "tests", "CMakeFiles", "*.dir", name)))
        if not hits:
            die("cannot find the stand-in's objects of %s in %s" % (rel, build))
        return hits
    d, inner = cmake_dir_of(src_root, rel)
    hits = glob.glob(os.path.join(build, d, "CMakeFiles", "*.dir", inner + ".o"))
    if len(hits) != 1:
        die("cannot find the one object file of %s in %s (found %s)" % (rel, build, hits))
    return hits


def file_hash(paths):
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def mtime_ns(path):
    return os.stat(path).st_mtime_ns


def newest_ns(paths):
    return max(mtime_ns(p) for p in paths)


def write_newer(path, text, than):
    """Writes path so that its mtime is strictly after those of the files
    `than`: make compares timestamps, and file systems keep them coarse (a
    clock tick, a second on some), so a file rewritten right after its
    object was built could look unchanged."""
    with open(path, "w") as f:
        f.write(text)
    while all(os.path.exists(t) for t in than) and mtime_ns(path) <= newest_ns(than):
        time.sleep(0.02)
        os.utime(path)


class Tree:
    """The scratch copy and its build."""

    def __init__(self, args, module):
        self.args, self.module = args, module
        self.src = os.path.join(args.dir, "src")
        self.build = os.path.join(args.dir, "build")
        self.logs = os.path.join(args.dir, "logs")
        self.tests = module["tests"]
        # a stand-in module's files, each with the tests that link it
        self.stand_in = module.get("stand_in")
        # programs the tests start as processes (built as their dependencies)
        self.programs = module.get("programs", [])
        self.objects = {}
        self.base_hash = {}
        self.written = None  # (path, original text, object) while a mutant is in place
        self.binaries = None  # test name -> its executable

    def configure_and_build(self):
        os.makedirs(self.logs, exist_ok=True)
        log = os.path.join(self.args.dir, "build.log")
        if run_logged(["cmake", "-S", self.src, "-B", self.build] + CMAKE_ARGS +
                      SANITIZE_ARGS[self.args.sanitize], log) != 0:
            die("configuring the scratch tree failed, see " + log)
        # an older tree (a baseline) may lack tests added to the table since
        listed = subprocess.run(["ctest", "-N"], cwd=self.build, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT).stdout.decode(errors="replace")
        registered = set(re.findall(r"Test\s+#\d+:\s+(\S+)", listed))
        missing = [t for t in self.tests if t not in registered]
        if missing:
            say("   warning: not in this tree, left out: %s" % " ".join(missing))
            self.tests = [t for t in self.tests if t in registered]
        if not self.tests:
            die("none of the module's tests is in this tree")
        if self.build_tests(log, append=True) != 0:
            die("building the unmutated tests failed, see " + log)
        for rel in self.module["files"]:
            self.objects[rel] = object_of(self.build, self.src, rel, self.stand_in)
            self.base_hash[rel] = file_hash(self.objects[rel])

    def build_tests(self, log, append=False):
        # a ctest name that runs another test's binary ("runs_of") builds that one
        runs_of = self.module.get("runs_of", {})
        targets = list(dict.fromkeys(runs_of.get(t, t) for t in self.tests))
        return run_logged(["cmake", "--build", self.build, "-j%d" % self.args.jobs,
                           "--target"] + targets, log, append=append)

    def build_object(self, rel, log):
        if self.stand_in:  # the .cu file rewritten, then compiled in each test
            return run_logged(["cmake", "--build", self.build, "-j%d" % self.args.jobs,
                               "--target"] + self.tests_of(rel), log)
        d, inner = cmake_dir_of(self.src, rel)
        return run_logged(["make", "-C", os.path.join(self.build, d),
                           "-j%d" % self.args.jobs, inner + ".o"], log)

    def put(self, rel, text):
        path = os.path.join(self.src, rel)
        with open(path) as f:
            original = f.read()
        self.written = (path, original, self.objects[rel])
        write_newer(path, text, self.objects[rel])

    def restore(self):
        if self.written is None:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            path, original, obj = self.written
            write_newer(path, original, obj)
            self.written = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def tests_of(self, rel):
        """The tests a mutant of rel can change: the module's, or in a
        stand-in module those that link rel."""
        return self.stand_in[rel] if self.stand_in else self.tests

    def run_tests(self, limit, tests=None):
        """(passed, timed out, names of failed tests, seconds)."""
        regex = "^(%s)$" % "|".join(re.escape(t) for t in tests or self.tests)
        cmd = ["ctest", "-R", regex, "--stop-on-failure", "--no-tests=error"]
        t0 = time.monotonic()
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1") if self.args.sanitize else None
        p = subprocess.Popen(cmd, cwd=self.build, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            out, _ = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_group(p)
            return False, True, [], time.monotonic() - t0
        except BaseException:
            kill_group(p)
            raise
        out = out.decode(errors="replace")
        # "1/2 Test #12: test_pools ....***Failed  0.08 sec", or
        # "....Subprocess aborted***Exception:  0.1 sec"
        failed = ["%s (%s)" % (name, " ".join(re.sub(r"\*+", " ", kind).split()))
                  for name, kind in re.findall(r"Test\s+#\d+:\s+(\S+)\s+\.*([^\n]*?)\s+[\d.]+ sec", out)
                  if not kind.strip().startswith("Passed")]
        return p.returncode == 0, False, failed, time.monotonic() - t0

    def check_linked(self, rel):
        """A test binary must be newer than the mutated object, or the
        build missed the change."""
        obj = newest_ns(self.objects[rel])
        if self.binaries is None:
            self.binaries = {}
            for t in self.tests:
                hits = glob.glob(os.path.join(self.build, "tests", "**", t), recursive=True)
                self.binaries[t] = [h for h in hits if os.path.isfile(h) and os.access(h, os.X_OK)]
            for prog in self.programs:
                path = os.path.join(self.build, prog)
                self.binaries[prog] = [path] if os.path.isfile(path) else []
        # a module's tests need not all link every file of it (the control
        # module's tests each link one piece): at least one must be newer
        linked = {t: self.binaries[t] for t in self.tests_of(rel) + self.programs}
        stale = [t for t, hits in linked.items() if hits and mtime_ns(hits[0]) < obj]
        if linked and len(stale) == len([h for h in linked.values() if h]):
            die("no test was relinked after %s changed (%s): stale build" %
                (rel, ", ".join(stale)), 3)


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def try_mutant(tree, m, stripped, limit):
    """Sets m.outcome: INVALID, EQUIVALENT, KILLED, TIMEOUT or SURVIVED."""
    t0 = time.monotonic()
    log = os.path.join(tree.logs, m.id + ".log")
    tree.put(m.rel, m.text(stripped[m.rel]))
    try:
        if tree.build_object(m.rel, log) != 0:
            m.outcome, m.note = "INVALID", first_error(log, tree.src)
        elif newest_ns(tree.objects[m.rel]) < mtime_ns(os.path.join(tree.src, m.rel)):
            die("%s was not recompiled after the mutant was written: stale build" % m.rel, 3)
        elif file_hash(tree.objects[m.rel]) == tree.base_hash[m.rel]:
            m.outcome, m.note = "EQUIVALENT", "same object code"
        elif tree.build_tests(log) != 0:
            m.outcome, m.note = "INVALID", first_error(log, tree.src)
        else:
            tree.check_linked(m.rel)
            passed, timed_out, failed, _ = tree.run_tests(limit, tree.tests_of(m.rel))
            if timed_out:
                m.outcome, m.note = "TIMEOUT", "over %g s" % limit
            elif passed:
                m.outcome = "SURVIVED"
            else:
                m.outcome, m.note = "KILLED", ", ".join(failed) or "ctest failed"
    finally:
        tree.restore()
    m.secs = time.monotonic() - t0
    if m.outcome not in ("INVALID",):
        os.remove(log)


# ------------------------------------------------------------ main

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="scripts/mutation.sh",
        usage="scripts/mutation.sh MODULE [N] [--seed S] [--timeout SECONDS] [--keep] [options]",
        description="Mutation testing of one module: samples N mutants of its source files "
                    "(universalmutator's C rules), builds each in a scratch copy of the tree, "
                    "runs only the module's unit tests, and prints the mutation score and the "
                    "surviving mutants.",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module", metavar="MODULE", choices=sorted(MODULES),
                    help="one of: " + ", ".join(MODULES))
    ap.add_argument("n", metavar="N", nargs="?", type=int, default=80,
                    help="how many mutants to sample (default 80)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    ap.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help="time limit of one mutant's test run (default: 10 times the "
                         "unmutated run, at least 30 s)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the scratch copy, its build and the mutant cache (a later run "
                         "with --dir reuses them)")
    ap.add_argument("--src", default=None, metavar="DIR",
                    help="the tree to copy (default: the one this script is in); a git work "
                         "tree is copied with its uncommitted changes, without ignored files")
    ap.add_argument("--dir", default=None, metavar="DIR",
                    help="scratch directory (default: a new /tmp/hpd-mutation-MODULE-XXXX)")
    ap.add_argument("--jobs", type=int, default=1, help="build jobs (default 1)")
    ap.add_argument("--fill", action="store_true",
                    help="draw further mutants, in the same seeded order, in place of invalid "
                         "and equivalent ones until N are scored")
    ap.add_argument("--sanitize", action="store_true",
                    help="build with AddressSanitizer (leak checks on) and UBSan, as "
                         "scripts/test.sh's second build does; still Release, HPD_ASSERT off")
    ap.add_argument("--with-logs", action="store_true",
                    help="also mutate the lines of HPD_LOG* calls")
    ap.add_argument("--judged", default=None, metavar="FILE",
                    help="survivors judged by hand (default scripts/mutation-judged.tsv): "
                         "ID, verdict (equivalent or sanitizer) and reason per line")
    ap.add_argument("--only", action="append", default=[], metavar="ID",
                    help="run only the mutant with this id (from results.tsv or "
                         "survivors.txt); repeatable; N and --seed are then ignored")
    return ap.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    module = MODULES[args.module]
    mutate = os.environ.get("MUTATE") or shutil.which("mutate")
    if not mutate or not os.access(mutate, os.X_OK):
        die(INSTALL_HINT)
    for tool in ("cmake", "ctest", "make", "git"):
        if not shutil.which(tool):
            die(tool + " not found")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args.src = os.path.abspath(args.src or here)
    args.judged = load_judged(args.judged or os.path.join(here, "scripts", "mutation-judged.tsv"))
    slug = args.module.replace("/", "-")
    if args.dir:
        args.dir = os.path.abspath(args.dir)
        os.makedirs(args.dir, exist_ok=True)
    else:
        args.dir = tempfile.mkdtemp(prefix="hpd-mutation-%s-" % slug, dir="/tmp")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run(args, module, mutate)
    finally:
        if not args.keep:
            for sub in ("src", "build", "mutants", "logs"):
                shutil.rmtree(os.path.join(args.dir, sub), ignore_errors=True)


def run(args, module, mutate):
    t_start = time.monotonic()
    say.open(os.path.join(args.dir, ("only-" if args.only else "") + "report.txt"))
    say("== mutation testing of %s: %s" % (args.module, " ".join(module["files"])))
    say("   tests: %s" % " ".join(module["tests"]))
    say("   source: %s  scratch: %s" % (args.src, args.dir))
    for rel in module["files"]:
        if not os.path.isfile(os.path.join(args.src, rel)):
            die("%s is not in %s" % (rel, args.src))
    folders = sorted({os.path.dirname(f) for f in module["files"]})
    for d in folders:
        for path in sorted(glob.glob(os.path.join(args.src, d, "*.c")) +
                           glob.glob(os.path.join(args.src, d, "*.cu"))):
            rel = os.path.relpath(path, args.src)
            if rel not in module["files"] and rel not in module["left_out"]:
                say("   warning: %s is in no module's table (scripts/mutation.py MODULES)" % rel)
    for rel, why in module["left_out"].items():
        say("   left out: %s (%s)" % (rel, why))

    tree = Tree(args, module)
    n_files, n_changed = sync_tree(args.src, tree.src)
    say("   copied %d files (%d written)" % (n_files, n_changed))

    # Every mutant of every file, in an order that depends only on the sources.
    cache_dir = os.path.join(args.dir, "mutants")
    os.makedirs(cache_dir, exist_ok=True)
    stripped, originals, everything = {}, {}, []
    raw_total = dup_total = skipped_total = 0
    skip_re = ASSERT_CALL if args.with_logs else ASSERT_CALL + "|" + LOG_CALL
    for rel in module["files"]:
        with open(os.path.join(tree.src, rel)) as f:
            originals[rel] = f.read()
        text = strip_comments(originals[rel])
        stripped[rel] = text.split("\n")
        raw, found = mutants_of(mutate, rel, text, cache_dir)
        skip = call_lines(text, skip_re)
        seen, kept = set(), 0
        for start, end, new in found:
            ident = (start, end, tuple(new))
            if ident in seen:
                dup_total += 1
                continue
            seen.add(ident)
            if start < end and any(i in skip for i in range(start, end)):
                skipped_total += 1
                continue
            everything.append(Mutant(rel, start, end, new, stripped[rel]))
            kept += 1
        raw_total += raw
        say("   %-28s %6d mutants written by mutate, %6d kept" % (rel, raw, kept))
    say("   %d mutants: %d written by mutate, %d duplicates, %d on %s lines left out"
        % (len(everything), raw_total, dup_total, skipped_total,
           "HPD_ASSERT" if args.with_logs else "HPD_ASSERT and HPD_LOG*"))

    nth = {}
    for m in everything:  # in file and line order
        nth[m.key] = nth.get(m.key, 0) + 1
        m.set_id(nth[m.key])

    if args.only:
        by_id = {m.id: m for m in everything}
        missing = [i for i in args.only if i not in by_id]
        if missing:
            die("no mutant with id %s in the current sources (its line was edited or removed)"
                % ", ".join(missing))
        order = [by_id[i] for i in args.only]
        args.n, args.fill = len(order), False
    else:
        order = list(everything)
        random.Random(args.seed).shuffle(order)

    say("== building the scratch tree (Release%s, -j%d; log: %s/build.log)"
        % (" with ASan and UBSan" if args.sanitize else "", args.jobs, args.dir))
    t0 = time.monotonic()
    tree.configure_and_build()
    say("   built in %.0f s" % (time.monotonic() - t0))
    check_stripping(tree, stripped)
    passed, _, failed, secs = tree.run_tests(600)
    if not passed:
        die("the unmutated tests fail (%s): fix them first" % ", ".join(failed))
    limit = args.timeout or max(30.0, round(10 * secs))
    say("   unmutated tests pass in %.1f s; time limit per mutant %g s" % (secs, limit))

    done = []
    interrupted = None
    target = min(args.n, len(order))
    say("== %d of %d mutants%s, seed %d" % (target, len(order),
        " (more in place of invalid and equivalent ones)" if args.fill else "", args.seed))
    try:
        for m in order:
            scored = sum(d.outcome in ("KILLED", "TIMEOUT", "SURVIVED") for d in done)
            if (scored if args.fill else len(done)) >= target:
                break
            try_mutant(tree, m, stripped, limit)
            done.append(m)
            say("[%3d/%d] %-10s %s  (%s%.1f s)" % (
                len(done), target, m.outcome, m.describe(stripped[m.rel]),
                m.note + ", " if m.note else "", m.secs))
    except (Interrupted, KeyboardInterrupt) as e:
        interrupted = str(e) or "SIGINT"
        tree.restore()
        say("== interrupted (%s) after %d mutants; sources restored" % (interrupted, len(done)))

    summarize(args, module, tree, done, everything, raw_total, stripped, originals,
              time.monotonic() - t_start)
    return 130 if interrupted else 0


def check_stripping(tree, stripped):
    """Mutants are built from the comment-free text; it must compile to the
    same object as the file itself, or "equivalent" would mean nothing."""
    for rel in tree.module["files"]:
        log = os.path.join(tree.logs, "strip-check.log")
        tree.put(rel, "\n".join(stripped[rel]))
        try:
            ok = tree.build_object(rel, log) == 0
            same = ok and file_hash(tree.objects[rel]) == tree.base_hash[rel]
        finally:
            tree.restore()
        if not same:
            die("%s without its comments builds to other object code (see %s)" % (rel, log), 3)
    # put the original objects back
    if tree.build_tests(os.path.join(tree.logs, "strip-check.log")) != 0:
        die("rebuilding the unmutated tests failed")


JUDGED_VERDICTS = ("equivalent", "sanitizer")


def load_judged(path):
    """Survivors judged by hand: {id: (verdict, reason)}. 'equivalent': no
    input can tell the mutant from the original; 'sanitizer': it survives the
    Release build but the ASan/UBSan build (scripts/test.sh's second half,
    --sanitize) kills it. A judged mutant is still run; the verdict only
    explains a survival, and a killed one counts as killed."""
    judged = {}
    if not os.path.isfile(path):
        return judged
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) < 3 or parts[1] not in JUDGED_VERDICTS:
                die("%s:%d: expected ID<TAB>%s<TAB>reason" % (path, n, "|".join(JUDGED_VERDICTS)))
            judged[parts[0]] = (parts[1], parts[2])
    return judged


def summarize(args, module, tree, done, everything, raw_total, stripped, originals, wall):
    count = {k: sum(m.outcome == k for m in done)
             for k in ("KILLED", "TIMEOUT", "SURVIVED", "INVALID", "EQUIVALENT")}
    killed = count["KILLED"] + count["TIMEOUT"]
    scored = killed + count["SURVIVED"]
    survivors = sorted((m for m in done if m.outcome == "SURVIVED"), key=lambda m: (m.rel, m.start))

    # a rerun of chosen mutants does not overwrite the sample's files
    prefix = "only-" if args.only else ""
    with open(os.path.join(args.dir, prefix + "results.tsv"), "w") as f:
        f.write("id\tfile\tline\toutcome\tseconds\tnote\toriginal\tmutant\n")
        for m in done:
            f.write("\t".join([m.id, m.rel, str(m.line()), m.outcome, "%.1f" % m.secs,
                               m.note.replace("\t", " "),
                               show(stripped[m.rel][m.start:m.end]), show(m.new)]) + "\n")
    with open(os.path.join(args.dir, prefix + "survivors.txt"), "w") as f:
        f.write("# %s: surviving mutants (seed %d), each as a patch against the source\n"
                % (args.module, args.seed))
        for m in survivors:
            f.write("\n## %s %s\n%s\n" % (m.id, m.describe(stripped[m.rel]), m.patch(originals[m.rel])))

    say("== %s: score %s" % (args.module,
        "%.1f %% (%d killed of %d)" % (100.0 * killed / scored, killed, scored) if scored else "n/a"))
    say("   mutants: %d in all (%d written by mutate), %d run: %d killed (%d by timeout), "
        "%d survived, %d invalid, %d equivalent" % (
            len(everything), raw_total, len(done), killed, count["TIMEOUT"],
            count["SURVIVED"], count["INVALID"], count["EQUIVALENT"]))
    by = {v: [m for m in survivors if args.judged.get(m.id, ("",))[0] == v] for v in JUDGED_VERDICTS}
    if any(by.values()):
        left = scored - len(by["equivalent"])
        say("   %d survivors judged equivalent, %d killed only under the sanitizers "
            "(scripts/mutation-judged.tsv)" % (len(by["equivalent"]), len(by["sanitizer"])))
        say("   of the non-equivalent: %s in Release, %s with the sanitizers' kills" % (
            "%.1f %% (%d/%d)" % (100.0 * killed / left, killed, left) if left else "n/a",
            "%.1f %% (%d/%d)" % (100.0 * (killed + len(by["sanitizer"])) / left,
                                 killed + len(by["sanitizer"]), left) if left else "n/a"))
    say("   wall time %.0f s (%dm%02ds)" % (wall, wall // 60, wall % 60))
    for v in JUDGED_VERDICTS:
        for m in by[v]:
            say("   judged %-10s %s  %s: %s" % (v, m.id, m.describe(stripped[m.rel]),
                                              args.judged[m.id][1]))
    survivors = [m for m in survivors if m.id not in args.judged]
    if survivors:
        say("== survivors (id  file:line: original  =>  mutant); patches in %s/%ssurvivors.txt"
            % (args.dir, prefix))
        for m in survivors:
            say("   %s  %s" % (m.id, m.describe(stripped[m.rel])))
    say("   files: %s/{%sreport.txt,%sresults.tsv,%ssurvivors.txt}" % (args.dir, prefix, prefix, prefix))


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (Interrupted, KeyboardInterrupt) as e:
        die("interrupted (%s); the scratch sources are restored" % (str(e) or "SIGINT"), 130)
