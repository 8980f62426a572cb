#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/).

Seeds are small valid inputs built from the fixtures' formats: protocol
messages of every type, tiny GGUF models (SentencePiece llama, byte-level BPE
qwen2, vocabulary-only), a tiny Hugging Face directory, and tokenizer texts.
Run from the repository root; the output is deterministic. Files named
regress-* are inputs that once crashed a target: they are kept by hand and
not written here."""
import json
import os
import random
import struct
import sys

import msgpack

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
FIX = os.path.join(ROOT, "tests", "fixtures")
rng = random.Random(7)


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- protocol
def pk(m):
    return msgpack.packb(m, use_bin_type=True)


REQS = [
    {"type": "hello", "id": 1, "version": 1, "client": "seed"},
    {"type": "generate", "id": 2, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.0},
    {"type": "generate", "id": 3, "tokens": [1, 2, 3, 400], "raw": True, "max_tokens": 4, "temperature": 0.7,
     "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 64, "seed": 42,
     "stop": ["\n", "The end"], "special": True, "system": "be brief"},
    {"type": "eval", "id": 4, "tokens": [1, 5, 6], "top": 5},
    {"type": "eval", "id": 5, "prompt": "hi", "raw": False, "top": 100},
    {"type": "tokenize", "id": 6, "text": "héllo <s> wörld", "special": True, "add_bos": False},
    {"type": "detokenize", "id": 7, "tokens": [1, 2, 3]},
    {"type": "cancel", "id": 2},
    {"type": "info", "id": 8},
    {"type": "ping", "id": 9},
]
EVS = [
    {"type": "hello", "id": 1, "version": 1, "server": "aned/0.1", "model": "stories260K"},
    {"type": "token", "id": 2, "token": 413, "text": " Once"},
    {"type": "logits", "id": 4, "pos": 0, "top": [[1, 2.5], [7, -1.0]]},
    {"type": "done", "id": 2, "finish": "length", "usage": {"prompt_tokens": 1, "cached_tokens": 0,
     "completion_tokens": 16}, "timings": {"queue_ms": 0.1, "prefill_ms": 1.0, "decode_ms": 9.0,
     "prefill_tps": 1000.0, "decode_tps": 1777.0}},
    {"type": "error", "id": 3, "code": "invalid_value", "message": "temperature -1 out of range"},
    {"type": "tokens", "id": 6, "tokens": [1, 2, 3]},
    {"type": "text", "id": 7, "text": "hello"},
    {"type": "info", "id": 8, "version": 1, "server": "aned/0.1", "model": "m", "arch": "llama",
     "backend": "cpu", "chat_template": "none", "warning": "", "n_vocab": 512, "n_ctx": 512, "n_layer": 5,
     "n_embd": 64, "tokenizer_only": False, "active": 1, "queued": 0, "clients": 2, "jobs_done": 3,
     "tokens_served": 10, "prompt_tokens_total": 4, "kv_used": 1, "kv_total": 8, "weight_bytes": 1000,
     "uptime_s": 1.5, "per_client": [{"uid": 0, "pid": 1, "active": 1, "queued": 0}], "model_path": "/m",
     "max_inflight": 32},
    {"type": "pong", "id": 9},
]


def proto_seeds():
    for i, m in enumerate(REQS):
        put("fuzz_proto", "req-%02d-%s" % (i, m["type"]), b"\x00" + pk(m))
    put("fuzz_proto", "req-stream", b"\x00" + b"".join(pk(m) for m in REQS))
    put("fuzz_proto", "req-stream-small", b"\x02" + b"".join(pk(m) for m in REQS))
    put("fuzz_proto", "req-stream-whole", b"\x04" + b"".join(pk(m) for m in REQS))
    put("fuzz_proto", "ev-stream-whole", b"\x05" + b"".join(pk(m) for m in EVS))
    for i, m in enumerate(EVS):
        put("fuzz_proto", "ev-%02d-%s" % (i, m["type"]), b"\x01" + pk(m))
    put("fuzz_proto", "ev-stream", b"\x01" + b"".join(pk(m) for m in EVS))
    put("fuzz_proto", "bad-nesting", b"\x00" + b"\x81\xa1a" + b"\x91" * 20 + b"\xc0")
    put("fuzz_proto", "bad-utf8", b"\x00" + pk({"type": "tokenize", "id": 1, "text": b"\xff\xfe"}))
    put("fuzz_proto", "bad-types", b"\x00" + pk({"type": "generate", "id": -1, "tokens": "x",
                                                    "temperature": float("nan"), "max_tokens": 1 << 40}))


# ---------------------------------------------------------------- GGUF
S, ARR, U32, I32, F32, BOOL = 8, 9, 4, 5, 6, 7


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == S:
        return gstr(v)
    if t == U32:
        return struct.pack("<I", v)
    if t == I32:
        return struct.pack("<i", v)
    if t == F32:
        return struct.pack("<f", v)
    if t == BOOL:
        return struct.pack("<?", v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)


def gguf(kv, tensors, align=32):
    """kv: [(key, type, value)]; tensors: [(name, dims, ggml type, bytes)]"""
    h = bytearray(struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kv)))
    for k, t, v in kv:
        h += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off, blobs = 0, []
    for name, dims, t, data in tensors:
        h += gstr(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", t, off)
        pad = (-len(data)) % align
        blobs.append(data + b"\0" * pad)
        off += len(data) + pad
    h += b"\0" * ((-len(h)) % align)
    return bytes(h) + b"".join(blobs)


def f32s(n):
    return struct.pack("<%df" % n, *[rng.uniform(-0.5, 0.5) for _ in range(n)])


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["\u2581", "\u2581the", "\u2581a", "e", "t", "o", "\u2581Once", "\u2581upon", "\u2581time", "h", "l"]
    toks += words
    types += [1] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return [("tokenizer.ggml.model", S, "llama"),
            ("tokenizer.ggml.tokens", ARR, (S, toks)),
            ("tokenizer.ggml.scores", ARR, (F32, scores)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0)], len(toks)


def bpe_vocab():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    toks = [chr(c) for c in cs]
    merges = ["\u0120 t", "h e", "\u0120t he", "i n", "o n"]
    for m in merges:
        toks.append(m.replace(" ", ""))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(toks) + [3] * len(specials)
    toks += specials
    return [("tokenizer.ggml.model", S, "gpt2"),
            ("tokenizer.ggml.pre", S, "qwen2"),
            ("tokenizer.ggml.tokens", ARR, (S, toks)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (S, merges)),
            ("tokenizer.ggml.eos_token_id", U32, len(toks) - 3),
            ("tokenizer.ggml.bos_token_id", U32, len(toks) - 3),
            ("tokenizer.ggml.add_bos_token", BOOL, False),
            ("tokenizer.chat_template", S, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")], len(toks)


def tiny_model(arch, vocab_kv, n_vocab, E=8, F=16, H=2, HKV=1, L=1, bias=False, qk_norm=False, eps=1e-5):
    hd = E // H
    kv = [("general.architecture", S, arch), ("general.name", S, "tiny-" + arch)] + [
        (arch + ".context_length", U32, 64), (arch + ".embedding_length", U32, E),
        (arch + ".feed_forward_length", U32, F), (arch + ".block_count", U32, L),
        (arch + ".attention.head_count", U32, H), (arch + ".attention.head_count_kv", U32, HKV),
        (arch + ".attention.layer_norm_rms_epsilon", F32, eps), (arch + ".rope.freq_base", F32, 10000.0),
    ] + vocab_kv
    t = [("token_embd.weight", [E, n_vocab], 0, f32s(E * n_vocab)),
         ("output_norm.weight", [E], 0, f32s(E))]
    for l in range(L):
        p = "blk.%d." % l
        t += [(p + "attn_norm.weight", [E], 0, f32s(E)),
              (p + "attn_q.weight", [E, H * hd], 0, f32s(E * H * hd)),
              (p + "attn_k.weight", [E, HKV * hd], 0, f32s(E * HKV * hd)),
              (p + "attn_v.weight", [E, HKV * hd], 0, f32s(E * HKV * hd)),
              (p + "attn_output.weight", [H * hd, E], 0, f32s(E * H * hd)),
              (p + "ffn_norm.weight", [E], 0, f32s(E)),
              (p + "ffn_gate.weight", [E, F], 0, f32s(E * F)),
              (p + "ffn_up.weight", [E, F], 0, f32s(E * F)),
              (p + "ffn_down.weight", [F, E], 0, f32s(E * F))]
        if bias:
            t += [(p + "attn_q.bias", [H * hd], 0, f32s(H * hd)), (p + "attn_k.bias", [HKV * hd], 0, f32s(HKV * hd)),
                  (p + "attn_v.bias", [HKV * hd], 0, f32s(HKV * hd))]
        if qk_norm:
            t += [(p + "attn_q_norm.weight", [hd], 0, f32s(hd)), (p + "attn_k_norm.weight", [hd], 0, f32s(hd))]
    return gguf(kv, t)


def gguf_seeds():
    spm, n_spm = spm_vocab()
    bpe, n_bpe = bpe_vocab()
    put("fuzz_gguf", "llama-spm.gguf", tiny_model("llama", spm, n_spm))
    put("fuzz_gguf", "qwen2-bpe.gguf", tiny_model("qwen2", bpe, n_bpe, bias=True))
    put("fuzz_gguf", "qwen3-bpe.gguf", tiny_model("qwen3", bpe, n_bpe, qk_norm=True))
    put("fuzz_gguf", "vocab-spm.gguf", gguf([("general.architecture", S, "llama")] + spm, []))
    put("fuzz_gguf", "vocab-bpe.gguf", gguf([("general.architecture", S, "qwen2")] + bpe, []))
    # the real stories260K header, cut before its weights
    with open(os.path.join(FIX, "models", "stories260K.gguf"), "rb") as f:
        put("fuzz_gguf", "stories260K-head.gguf", f.read(12000))
    put("fuzz_gguf", "header-only.gguf", struct.pack("<4sIQQ", b"GGUF", 3, 0, 0))


def defect_seeds():
    """GGUFs with one defect each, refused at load (a key twice, eps NaN, BOS
    past the vocabulary); written last, so the other seeds' bytes stay."""
    spm, n_spm = spm_vocab()
    put("fuzz_gguf", "dup-key.gguf", tiny_model("llama", spm + [("tokenizer.ggml.bos_token_id", U32, 1)], n_spm))
    put("fuzz_gguf", "eps-nan.gguf", tiny_model("llama", spm, n_spm, eps=float("nan")))
    put("fuzz_gguf", "bos-past-vocab.gguf",
        tiny_model("llama", [kv for kv in spm if kv[0] != "tokenizer.ggml.bos_token_id"] +
                   [("tokenizer.ggml.bos_token_id", U32, n_spm)], n_spm))


# ---------------------------------------------------------------- HF dir
SEP = b"\n#--8<--#\n"


def bf16s(n):
    out = bytearray()
    for _ in range(n):
        out += struct.pack("<f", rng.uniform(-0.5, 0.5))[2:4]
    return bytes(out)


def safetensors(tensors):
    hdr, off, blobs = {}, 0, []
    for name, shape, data in tensors:
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def tiny_tokenizer_json():
    with open(os.path.join(FIX, "hf", "qwen2-tiny", "tokenizer.json")) as f:
        tj = json.load(f)
    keep = 300
    vocab = {k: v for k, v in tj["model"]["vocab"].items() if v < keep}
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(m)
    tj["model"]["vocab"] = vocab
    tj["model"]["merges"] = merges
    for i, at in enumerate(tj.get("added_tokens", [])):
        at["id"] = keep + i
    n = keep + len(tj.get("added_tokens", []))
    return json.dumps(tj, ensure_ascii=False).encode(), n


def hf_seeds():
    tjb, n_vocab = tiny_tokenizer_json()
    E, F, H, HKV = 8, 16, 2, 1
    hd = E // H
    cfg = {"model_type": "qwen2", "hidden_size": E, "intermediate_size": F, "num_hidden_layers": 1,
           "num_attention_heads": H, "num_key_value_heads": HKV, "vocab_size": n_vocab,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": n_vocab - 1}
    p = "model.layers.0."
    ts = [("model.embed_tokens.weight", [n_vocab, E], bf16s(n_vocab * E)), ("model.norm.weight", [E], bf16s(E)),
          (p + "input_layernorm.weight", [E], bf16s(E)), (p + "post_attention_layernorm.weight", [E], bf16s(E)),
          (p + "self_attn.q_proj.weight", [H * hd, E], bf16s(E * H * hd)),
          (p + "self_attn.k_proj.weight", [HKV * hd, E], bf16s(E * HKV * hd)),
          (p + "self_attn.v_proj.weight", [HKV * hd, E], bf16s(E * HKV * hd)),
          (p + "self_attn.q_proj.bias", [H * hd], bf16s(H * hd)),
          (p + "self_attn.k_proj.bias", [HKV * hd], bf16s(HKV * hd)),
          (p + "self_attn.v_proj.bias", [HKV * hd], bf16s(HKV * hd)),
          (p + "self_attn.o_proj.weight", [E, H * hd], bf16s(E * H * hd)),
          (p + "mlp.gate_proj.weight", [F, E], bf16s(E * F)), (p + "mlp.up_proj.weight", [F, E], bf16s(E * F)),
          (p + "mlp.down_proj.weight", [E, F], bf16s(E * F))]
    st = safetensors(ts)
    put("fuzz_hf", "qwen2-tiny-dir", json.dumps(cfg).encode() + SEP + st + SEP + tjb)
    cfg3 = dict(cfg, model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, tie_word_embeddings=False)
    ts3 = [t for t in ts if not t[0].endswith(".bias")] + [("lm_head.weight", [n_vocab, E], bf16s(n_vocab * E))]
    put("fuzz_hf", "llama3-tiny-dir", json.dumps(cfg3).encode() + SEP + safetensors(ts3) + SEP + tjb +
        SEP + b'{"add_bos_token": false, "chat_template": "{{ messages }}"}')
    # wrong JSON types and ranges in config.json, refused at load
    put("fuzz_hf", "qwen2-hidden-array", json.dumps(dict(cfg, hidden_size=[E, 1])).encode() + SEP + st + SEP + tjb)
    put("fuzz_hf", "qwen2-bos-past-vocab", json.dumps(dict(cfg, bos_token_id=n_vocab)).encode() + SEP + st + SEP + tjb)
    # the real fixture config with the fixture tokenizer (no tokenizer part): rejected on weights
    with open(os.path.join(FIX, "hf", "qwen2-tiny", "config.json"), "rb") as f:
        put("fuzz_hf", "qwen2-config-only", f.read() + SEP + st[:600])


# ---------------------------------------------------------------- tokenizer
def tok_seeds():
    texts = [b"Once upon a time, there was a little girl named Lily.",
             "héllo wörld — ünïcödé 日本語 🙂".encode(),
             b"<s>hello</s> <|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
             b"  leading spaces\t\ttabs\n\nnewlines   ",
             b"\xff\xfe invalid \xc3 utf8 \xe2\x82 \xed\xa0\x80",
             b"12345 3.14159 $$$ ''' \"\"\" it's we'll I'm",
             b"<think>\nreasoning</think>answer"]
    for v in range(5):                     # one per vocabulary (fuzz_tok.c's order)
        for mode in range(4):
            for i, t in enumerate(texts):
                if mode == 3 and i > 1:
                    continue
                b = [x for x in range(256) if x % 5 == v and (x // 8) % 4 == mode][0]
                put("fuzz_tok", "v%d-m%d-%d" % (v, mode, i), bytes([b]) + t)


# ---------------------------------------------------------------- jinja
def jinja_seeds():
    """Every fixture chat template with one of three conversations, and
    small templates for the constructs the real ones rarely use."""
    jsep = b"\n#--8<--#\n"
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    convs = [
        {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True,
         "bos_token": "<s>", "eos_token": "</s>"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
                      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 12}"}],
         "tools": [weather], "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"},
        {"messages": [{"role": "assistant", "content": "odd start 🙂"}, {"role": "user", "content": "ok"},
                      {"role": "user", "content": [{"type": "text", "text": "parts"}]}],
         "add_generation_prompt": False, "bos_token": "", "eos_token": "", "enable_thinking": False},
    ]
    tdir = os.path.join(FIX, "chat", "templates")
    for i, name in enumerate(sorted(os.listdir(tdir))):
        with open(os.path.join(tdir, name), "rb") as f:
            src = f.read()
        put("fuzz_jinja", name[:-len(".jinja")], src + jsep + json.dumps(convs[i % 3]).encode())
    small = [
        "{%- for m in messages -%}{{ loop.index }}:{{ m.role|upper }}{% if not loop.last %}, {% endif %}{%- endfor %}",
        "{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'tool' %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
        "{% macro r(x, d=0) %}{% if x is mapping %}{% for k, v in x|dictsort %}{{ k }}={{ r(v, d + 1) }}{% endfor %}"
        "{% elif x is iterable and x is not string %}[{% for v in x %}{{ r(v, d + 1) }}{% endfor %}]{% else %}{{ x }}{% endif %}"
        "{% endmacro %}{{ r(tools) }}",
        "{{ messages|tojson(indent=2) }}{{ tools|map(attribute='function.name')|list }}{{ (messages|last).content[1:3] }}",
        "{% raw %}{{ raw }}{% endraw %}{# c #}{{ '%s-%05.1f' % ('a', 2.25) }}{{ '{}:{:>4}'.format(1, 'b') }}",
        "{% call(x) loop_it([1, 2]) %}<{{ x }}>{% endcall %}{% macro loop_it(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}",
        "{{ raise_exception('no: ' ~ messages[0].role) if messages[0].role != 'user' }}{{ strftime_now('%Y-%m-%d') }}",
        "{{ messages.append(1) }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n) ~ f(n) }}{% endmacro %}{{ f(1) }}",
        "{{ ('x' * 1000) * 1000 }}{{ [[[[[[[[1]]]]]]]] }}{{ 'ab'|reverse }}{{ 'é'|length }}",
    ]
    for i, src in enumerate(small):
        put("fuzz_jinja", "small-%02d" % i, src.encode() + (jsep + json.dumps(convs[1]).encode() if i % 2 else b""))


# ---------------------------------------------------------------- tool calls
def toolcall_seeds():
    """Replies in each format (fuzz_toolcall: format byte, piece seed, text)."""
    ds = lambda m: "<\uff5ctool\u2581" + m + "\uff5c>"
    replies = [
        (1, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        (1 | 8, '<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>'),
        (2, '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "b", "parameters": {}}'),
        (2, '<|python_tag|>brave_search.call(query="x")<|eom_id|>'),
        (3, '[TOOL_CALLS][{"name": "a", "arguments": {"q": [1]}, "id": "abc123def"}]'),
        (3 | 8, '[THINK]t[/THINK][TOOL_CALLS]a[CALL_ID]abc123def[ARGS]{"x": "\u00e9"}[TOOL_CALLS]b[ARGS]{}'),
        (4, '<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary to=functions.f '
            '<|constrain|>json<|message|>{"a": 1}<|call|>'),
        (4, '<|channel|>final<|message|>Hello<|return|>'),
        (5 | 16, 'r</think>c' + ds("calls\u2581begin") + ds("call\u2581begin") + "f" + ds("sep") + '{"a": [2]}'
            + ds("call\u2581end") + ds("calls\u2581end")),
        (5, ds("calls\u2581begin") + ds("call\u2581begin") + "function" + ds("sep") + 'f\n```json\n{}\n```'
            + ds("call\u2581end")),
        (6, 'all\nText>>>get_weather\n{"city": "Paris"}>>>python\nprint(1)'),
        (0, 'plain text \u00fc <tool_call>'),
    ]
    for i, (fmt, text) in enumerate(replies):
        put("fuzz_toolcall", "reply-%02d" % i, bytes([fmt, i * 37 % 256]) + text.encode())


def main():
    proto_seeds()
    gguf_seeds()
    hf_seeds()
    tok_seeds()
    defect_seeds()
    jinja_seeds()
    toolcall_seeds()
    total = 0
    for d, _, fs in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in fs)
    print("corpus: %d bytes" % total)


if __name__ == "__main__":
    sys.exit(main())
