#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<name>/), small real-shaped inputs.

    python3 tests/fuzz/make_corpus.py

Deterministic; the output is committed. Binary seeds (safetensors, llama2.c, payload codecs) are built here
byte by byte from the formats' documentation in the readers' headers; the model seeds are shrunken copies of
the tests/fixtures/hf folders (same tensor names, tiny sizes). Nothing comes from the assets folder.
Files named crash_* / oom_* are inputs the fuzzers found (regression inputs, docs/reliability.md): this script
leaves them in place.
"""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*parts):
    with open(os.path.join(ROOT, *parts), "rb") as f:
        return f.read()


def parts(*xs):
    """Joins parts with the separator line the multi-file targets split at (fuzz_util.h split_parts)."""
    return b"\n%%\n".join(x.encode() if isinstance(x, str) else x for x in xs)


# ---- safetensors -------------------------------------------------------------------------------------------

def f32(n, scale=0.01):
    return struct.pack("<%df" % n, *[((i * 37) % 17 - 8) * scale for i in range(n)])


def f16(n):
    return struct.pack("<%de" % n, *[((i * 37) % 17 - 8) * 0.01 for i in range(n)])


def bf16(n):
    return b"".join(struct.pack("<f", ((i * 37) % 17 - 8) * 0.01)[2:] for i in range(n))


def safetensors(tensors, metadata=None, dtype="F32"):
    """tensors: [(name, shape)] (or (name, shape, dtype, bytes)). Header padded to 8 bytes, as safetensors does."""
    header, data = {}, b""
    for t in tensors:
        name, shape = t[0], t[1]
        n = 1
        for d in shape:
            n *= d
        dt = t[2] if len(t) > 2 else dtype
        raw = t[3] if len(t) > 3 else {"F32": f32, "F16": f16, "BF16": bf16}[dt](n)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def shrink_hf(family, mapping, config_edits, keep_layers=1, dtype="F32"):
    """A tiny copy of tests/fixtures/hf/FAMILY: config.json with config_edits, and every tensor of the first
    keep_layers layers with each dimension d replaced by mapping[d]."""
    cfg = json.loads(read("tests", "fixtures", "hf", family, "config.json"))
    cfg.update(config_edits)
    b = read("tests", "fixtures", "hf", family, "model.safetensors")
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    tensors = []
    for name in sorted(k for k in header if k != "__metadata__"):
        idx = [p for p in name.split(".") if p.isdigit()]
        if idx and int(idx[0]) >= keep_layers:
            continue
        tensors.append((name, [mapping.get(d, d) for d in header[name]["shape"]]))
    return json.dumps(cfg, indent=2), safetensors(tensors, {"format": "pt"}, dtype)


LLAMA = shrink_hf("llama", {32: 4, 64: 8, 96: 8, 16: 2},
                  {"hidden_size": 4, "intermediate_size": 8, "vocab_size": 8, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 2, "num_hidden_layers": 1, "max_position_embeddings": 16})
LLAMA_BF16 = shrink_hf("llama", {32: 4, 64: 8, 96: 8, 16: 2},
                       {"hidden_size": 4, "intermediate_size": 8, "vocab_size": 8, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "head_dim": 2, "num_hidden_layers": 1,
                        "max_position_embeddings": 16, "tie_word_embeddings": False}, dtype="BF16")
GPT2 = shrink_hf("gpt2", {32: 4, 96: 12, 128: 16, 64: 8, 100: 8},
                 {"n_embd": 4, "n_head": 2, "n_layer": 1, "n_positions": 8, "vocab_size": 8,
                  "bos_token_id": 7, "eos_token_id": 7}, dtype="F16")
OPT = shrink_hf("opt", {32: 4, 64: 8, 304: 8, 66: 10},
                {"hidden_size": 4, "ffn_dim": 8, "vocab_size": 8, "max_position_embeddings": 8,
                 "num_attention_heads": 2, "num_hidden_layers": 1, "word_embed_proj_dim": 4})
OPT_PROJ = shrink_hf("opt_proj", {16: 4, 32: 8, 64: 8, 12: 2, 66: 10},
                     {"hidden_size": 4, "ffn_dim": 8, "vocab_size": 8, "max_position_embeddings": 8,
                      "num_attention_heads": 2, "num_hidden_layers": 1, "word_embed_proj_dim": 2})


def gen_hf():
    for name, (cfg, st) in [("llama", LLAMA), ("llama_bf16", LLAMA_BF16), ("gpt2_f16", GPT2), ("opt", OPT),
                            ("opt_proj", OPT_PROJ)]:
        write("hf", name, parts(cfg, st))
    # configs alone: the variants hf_config_from_json refuses or maps
    write("hf", "opt_post_norm", parts(json.dumps(dict(json.loads(OPT[0]), do_layer_norm_before=False))))
    write("hf", "llama_rope_scaling", parts(json.dumps(dict(json.loads(LLAMA[0]),
                                                            rope_scaling={"type": "linear", "factor": 2.0}))))
    write("hf", "gpt2_bad_act", parts(json.dumps(dict(json.loads(GPT2[0]), activation_function="swish"))))


def gen_safetensors():
    write("safetensors", "llama", LLAMA[1])
    write("safetensors", "gpt2_f16", GPT2[1])
    write("safetensors", "mixed", safetensors([
        ("a", [2, 3]), ("b", [3], "BF16"), ("c", [2, 2], "F16"), ("ids", [2], "I64", struct.pack("<2q", 1, 2)),
        ("scalar", []), ("empty", [0, 4])], {"format": "pt", "note": "seed"}))
    index = {"metadata": {"total_size": 48}, "weight_map": {"a": "model.safetensors", "b": "model.safetensors"}}
    write("safetensors", "sharded", parts(safetensors([("a", [2, 3]), ("b", [3], "BF16")]), json.dumps(index)))


# ---- llama2.c ----------------------------------------------------------------------------------------------

def llama2c(version, dim=4, hidden=8, layers=1, heads=2, kv_heads=1, vocab=8, seq=4, shared=True):
    hs = dim // heads
    kv = kv_heads * hs
    L = layers
    if version == 0:
        head = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq)
        n = (vocab * dim + L * dim + L * dim * dim + 2 * L * dim * kv + L * dim * dim + L * dim + 3 * L * hidden * dim +
             dim + 2 * seq * hs // 2 + (0 if shared else vocab * dim))
    else:
        head = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv_heads, vocab, seq, 1 if shared else 0)
        head += b"\0" * (256 - len(head))
        n = (2 * L * dim + dim + vocab * dim + L * dim * dim + 2 * L * dim * kv + L * dim * dim + 3 * L * hidden * dim +
             (0 if shared else vocab * dim))
    return head + f32(n)


def gen_llama2c():
    write("llama2c", "v0_shared", llama2c(0))
    write("llama2c", "v0_untied", llama2c(0, shared=False))
    write("llama2c", "v1_shared", llama2c(1))
    write("llama2c", "v1_untied_gqa", llama2c(1, dim=8, heads=4, kv_heads=2, shared=False))
    write("llama2c", "v1_truncated", llama2c(1)[:300])


# ---- PEFT adapters -----------------------------------------------------------------------------------------

def gen_adapter():
    cfg = read("tests", "fixtures", "peft", "llama_lora", "adapter_config.json")
    st = read("tests", "fixtures", "peft", "llama_lora", "adapter_model.safetensors")
    write("adapter", "llama_lora", parts(cfg, st))
    c = json.loads(cfg)
    write("adapter", "config_only", parts(json.dumps(dict(c, r=4, target_modules=["q_proj"]))))
    write("adapter", "not_lora", parts(json.dumps(dict(c, peft_type="PREFIX_TUNING")), st))


# ---- DeepSpeed-Chat JSONL, LM text, DeepSpeed JSON ---------------------------------------------------------

PCR = [
    {"prompt": "\n\nHuman: What is a fox?\n\nAssistant:", "chosen": " A small wild dog.", "rejected": " A fish."},
    {"prompt": "\n\nHuman: Say hi.\n\nAssistant:", "chosen": " Hi!", "rejected": " No."},
    {"prompt": "\n\nHuman: Count to three.\n\nAssistant:", "chosen": " One, two, three.", "rejected": " Four."},
]


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def gen_dschat():
    # the first byte also picks the layout and the length limits (fuzz_dschat_data.cpp); '{' = 0x7b
    write("dschat_data", "prompt_chosen_rejected", jsonl(PCR))
    write("dschat_data", "prompt_chosen", jsonl([{"prompt": r["prompt"], "chosen": r["chosen"]} for r in PCR]))
    hh = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in PCR]
    write("dschat_data", "hh_rlhf_raw", jsonl(hh))
    write("dschat_data", "malformed_lines", jsonl(PCR[:1]) + "{not json\n\n[1, 2]\n" +
          '{"prompt": "x", "chosen": "", "rejected": "y"}\n{"prompt": 3, "chosen": "a", "rejected": "b"}\n')
    write("dschat_data", "gzip", gzip.compress(jsonl(PCR).encode(), mtime=0))
    write("dschat_data", "unicode", jsonl([{"prompt": "Qu'est-ce que \u00e7a ? \u732b \U0001f431", "chosen": " \u00e9t\u00e9",
                                            "rejected": "\ud83d\ude00 \\u0000"}]))
    # one JSON list of rows (json.dump(rows), DS-Chat's local/jsonfile train.json): read as rows, items numbered
    write("dschat_data", "json_list", json.dumps(PCR, indent=2))
    write("dschat_data", "json_list_mixed", "\ufeff" + json.dumps(PCR[:1] + ["text", [1, 2], {"prompt": "x"}, None]))


STORY = ("Once upon a time, there was a little fox named Tim. Tim liked to run in the green grass.\n"
         "One day, Tim saw a big red ball. \"Can I play?\" he asked.\n")


def gen_lm():
    write("lm_data", "stories", STORY + "\n" + STORY.replace("Tim", "Sue") + "\n\n" + STORY)
    write("lm_data", "one_line", "\x05" + "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3)
    write("lm_data", "crlf_unicode", "\x87" + STORY.replace("\n", "\r\n") + "\u732b\u3068\u72ac \u00e9t\u00e9\n")


def gen_ds_config():
    for f in ["dschat_train_stage3.json", "dschat_eval_stage3_bf16.json", "hf_trainer_auto.json"]:
        write("ds_config", f.replace(".json", ""), read("tests", "fixtures", "ds", f))
    write("ds_config", "warmup_decay", json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                          "warmup_num_steps": 10, "total_num_steps": 100}},
        "fp16": {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 4, "hysteresis": 2,
                 "min_loss_scale": 1}, "zero_optimization": {"stage": 2}, "gradient_clipping": 0.5}))
    write("ds_config", "bf16_cosine", json.dumps({
        "train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": True,
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 5}}}))


# ---- graphs ------------------------------------------------------------------------------------------------

def gen_graph():
    gen = read("graphs", "examples", "generate.graph").decode()
    write("graph", "generate", gen)
    write("graph", "generate_rr", read("tests", "graphs", "cluster", "generate_rr.graph"))
    write("graph", "feedback", read("tests", "graphs", "good", "feedback.graph"))
    write("graph", "pipeline_sets", parts(read("tests", "graphs", "good", "pipeline.graph"), "",
                                          "graph.seed=42\nnode.gen.temperature=0.5\nnode.gen.replicas=2\n"
                                          "node.gen.on=\"any\"\ngraph.name=\"renamed\"\nnode.nope.x=1\nbad"))
    main = ('include = ["inc.graph"]\nedges = ["src.lines -> tok.text", "tok -> gen", '
            '"gen.completions -> out, log [credit=4, dispatch=round_robin]"]\n'
            '[graph]\nname = "with_include"\nsteps = 5\n[node.gen]\nmax_new_tokens = 32\n'
            '[node.log]\nkind = "sink"\n')
    inc = ('[graph]\nseed = 7\nsteps = 3\n[node.src]\nkind = "text_source"\npath = "in.txt"\n'
           '[node.tok]\nkind = "tokenizer"\nmodel = "tok.model"\n[node.gen]\nkind = "generator"\n'
           'model = "m.bin"\ntokenizer = "tok.model"\nmax_new_tokens = 16\n[node.out]\nkind = "sink"\n')
    write("graph", "include", parts(main, inc))
    cluster = ('[cluster]\nheartbeat_ms = 500\nlost_after_ms = 3000\non_node_lost = "stop"\n'
               '[cluster.nodes.w1]\naddress = "127.0.0.1:7001"\ncpus = 2\n'
               '[cluster.nodes.w2]\naddress = "[::1]:7002"\ncpus = 1\ngpus = 0\n')
    write("graph", "cluster_any", parts(read("tests", "graphs", "cluster", "generate_any.graph"), "", "", cluster))
    write("graph", "bad_edges", 'edges = ["a.b -> ", "x -> y [credit=0, dispatch=sideways, feedback, feedback]", '
                                '"a -> b -> c", "\\u00e9 -> b"]\n[node.a]\nkind = "sink"\n')


# ---- tokenizer ---------------------------------------------------------------------------------------------

def gen_tokenizer():
    write("tokenizer", "encode_story", b"\x00" + STORY.encode())
    write("tokenizer", "encode_bos_eos", b"\x03" + b"Hello world<|endoftext|> 123 it's   spaces\t\n")
    write("tokenizer", "encode_unicode", b"\x00" + "na\u00efve caf\u00e9 \u732b \U0001f431 \u0301".encode())
    write("tokenizer", "encode_bad_utf8", b"\x01" + b"ab\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x98")
    write("tokenizer", "decode_ids", b"\xc0" + struct.pack("<8i", 0, 1, 2, 50, 100, 255, 256, 399))
    write("tokenizer", "decode_wild", b"\x80" + struct.pack("<5i", -1, 2**31 - 1, -2**31, 400, 401))


# ---- hf_tokenizer ------------------------------------------------------------------------------------------

def mini_tokenizer_json(model, normalizer=None, pre_tokenizer=None, decoder=None, post_processor=None, added=()):
    return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": [dict(id=i, content=c, single_word=False, lstrip=ls, rstrip=rs,
                                             normalized=False, special=True) for i, c, ls, rs in added],
                       "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "model": model,
                       "decoder": decoder, "post_processor": post_processor}, ensure_ascii=False)


def gen_hf_tokenizer():
    # the shapes of tests/fixtures/hftok (Llama 3, Qwen2, Llama 2, Mistral) with a vocabulary of a few tokens
    bl_chars = [chr(c) for c in range(0x21, 0x7f)] + ["\u0120", "\u010a", "\u0109"]
    bl_vocab = {"<|begin_of_text|>": 0, "<|eot_id|>": 1}
    for c in bl_chars:
        bl_vocab[c] = len(bl_vocab)
    bl_vocab.update({"\u0120t": len(bl_vocab), "he": len(bl_vocab) + 1, "\u0120the": len(bl_vocab) + 2})
    bl_model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                "vocab": bl_vocab, "merges": [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]]}
    llama3_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [0],
                                                                     "tokens": ["<|begin_of_text|>"]}}}
    write("hf_tokenizer", "llama3_like", mini_tokenizer_json(
        bl_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": llama3_re}, "behavior": "Isolated", "invert": False}, bl]},
        decoder=dict(bl), post_processor={"type": "Sequence", "processors": [dict(bl), template]},
        added=[(0, "<|begin_of_text|>", False, False), (1, "<|eot_id|>", False, False)]))
    write("hf_tokenizer", "qwen2_like_text", parts(mini_tokenizer_json(
        dict(bl_model, ignore_merges=False), normalizer={"type": "NFC"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": llama3_re.replace("{1,3}", "")}, "behavior": "Isolated",
             "invert": False}, bl]}, decoder=dict(bl), added=[(1, "<|eot_id|>", True, True)]),
        "cafe\u0301 \u4e2d\u6587 12345  <|eot_id|>  the\n\n\tend"))
    fb_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        fb_vocab["<0x%02X>" % b] = len(fb_vocab)
    for p in ["\u2581", "t", "h", "e", "a", "\u2581t", "he", "\u2581the"]:
        fb_vocab[p] = len(fb_vocab)
    fb_model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                "vocab": fb_vocab, "merges": ["\u2581 t", "h e", "\u2581t he"]}
    write("hf_tokenizer", "llama2_like", mini_tokenizer_json(
        fb_model, normalizer={"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        decoder={"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        post_processor=dict(template, single=[{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                              {"Sequence": {"id": "A", "type_id": 0}}],
                            special_tokens={"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}),
        added=[(0, "<unk>", False, False), (1, "<s>", False, False), (2, "</s>", False, False)]))
    write("hf_tokenizer", "mistral_like", mini_tokenizer_json(
        fb_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}]},
        decoder={"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                       "split": False}]},
        added=[(0, "<unk>", False, False), (1, "<s>", True, False), (2, "</s>", False, True)]))
    write("hf_tokenizer", "unsupported_pre_tokenizer", mini_tokenizer_json(
        fb_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}))


# ---- console -----------------------------------------------------------------------------------------------

def http(method, path, headers=(), body=b""):
    h = "%s %s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n" % (method, path) + "".join(x + "\r\n" for x in headers)
    return h.encode() + b"\r\n" + body


def gen_console():
    tok = "Authorization: Bearer fuzztoken"
    for name, req in [
        ("get_status", http("GET", "/api/status")),
        ("get_node_escaped", http("GET", "/api/nodes/%ff")),
        ("get_node", http("GET", "/api/nodes/gen")),
        ("get_graph_edges", http("GET", "/api/graph", ["Connection: keep-alive"]) + http("GET", "/api/edges")),
        ("bottlenecks", http("GET", "/api/bottlenecks?n=1e308&x=%zz")),
        ("signals_events", http("GET", "/api/signals?since=-inf") + http("GET", "/api/events?since=nan")),
        ("memory_cluster", http("GET", "/api/memory") + http("GET", "/api/cluster") + http("GET", "/api")),
        ("page", http("GET", "/") + http("GET", "/console.js") + http("HEAD", "/console.css")),
        ("post_pause_nobody", http("POST", "/api/pause", [tok])),
        ("post_resume_body", http("POST", "/api/resume", ["X-Flowrun-Token: fuzztoken", "Content-Length: 5"], b"hello")),
        ("post_checkpoint_chunked", http("POST", "/api/checkpoint?token=fuzztoken", ["Transfer-Encoding: chunked"],
                                         b"5\r\nhello\r\n0\r\n\r\n")),
        ("post_stop_wrong_token", http("POST", "/api/stop", ["Authorization: Bearer nope"])),
        ("post_no_token", http("POST", "/api/pause")),
        ("bad_host", http("GET", "/api/status").replace(b"127.0.0.1:8080", b"evil.example:80")),
        ("stream_finished", b"#" + http("GET", "/api/stream")),
        ("post_finished", b"#" + http("POST", "/api/stop", [tok])),
        ("range_header", http("GET", "/", ["Range: bytes=0-10,20-"])),
        ("not_found", http("DELETE", "/api/nodes/gen/x?token=fuzztoken")),
    ]:
        write("console", name, req)


# ---- cluster -----------------------------------------------------------------------------------------------

TYPES = ["text", "tokens", "model", "rollouts", "scores", "experience", "tick", "prompt_batch", "stats", "summary",
         "lm_batch"]


def sel_payload(t):
    return bytes([4 * TYPES.index(t)])


def bulk_header(tensors, first_tag=100):
    """tensors: [(dtype index, shape)]; dtype: 0 f32, 1 bf16, 2 f16, 3 i32, 4 i64."""
    out = struct.pack("<QI", first_tag, len(tensors))
    for dt, shape in tensors:
        out += struct.pack("<BI", dt, len(shape)) + b"".join(struct.pack("<q", d) for d in shape)
    return out


def s(x):
    x = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(x)) + x


def int_tensor(dt, shape, values):
    return struct.pack("<BI", dt, len(shape)) + b"".join(struct.pack("<q", d) for d in shape) + \
        struct.pack("<%d%s" % (len(values), "i" if dt == 3 else "q"), *values)


def gen_cluster():
    write("cluster", "text", sel_payload("text") + "Once upon a time \u732b".encode())
    write("cluster", "tokens", sel_payload("tokens") + struct.pack("<4i", 1, 2, 3, 4))
    write("cluster", "tick", sel_payload("tick") + struct.pack("<q", 7))
    write("cluster", "stats", sel_payload("stats") + struct.pack("<qddddq", 3, 0.5, 1.25, 0.1, 0.0, 128))
    write("cluster", "summary", sel_payload("summary") + struct.pack("<qB", 2, 5) + struct.pack("<dddd", 0.1, 0.2, 9.0, 1.5) +
          struct.pack("<q", 64) + b"\0" * 16)
    write("cluster", "prompt_batch", sel_payload("prompt_batch") + int_tensor(3, [2, 3], [1, 2, 3, 4, 5, 6]) +
          int_tensor(3, [2, 3], [0, 1, 1, 1, 1, 1]) + struct.pack("<qBq", 4, 0, 2))
    cfg = {"model_type": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 8, "real_vocab_size": 8,
           "max_position_embeddings": 4, "norm_eps": 1e-5, "norm": "rmsnorm", "rope_theta": 10000.0,
           "rope_layout": "adjacent", "use_rope": True, "position_offset": 0, "gated_mlp": True,
           "hidden_act": "silu", "bias": False, "tie_word_embeddings": True}
    n_params = 8 * 4 + 1 * (2 * 4 + (16 + 2 * 8 + 16) + (2 * 32 + 32)) + 4
    write("cluster", "model", sel_payload("model") + bulk_header([(0, [n_params])]) +
          struct.pack("<qB", 3, 0) + s("tok.model") + s(json.dumps(cfg)) + b"\0" + struct.pack("<i", 0))
    write("cluster", "model_value_head", sel_payload("model") + bulk_header([(0, [n_params]), (0, [1, 4])]) +
          struct.pack("<qB", 3, 1) + s("") + s(json.dumps(cfg)) + b"\1" + struct.pack("<ii", 0, 1))
    write("cluster", "lm_batch", sel_payload("lm_batch") + bulk_header([(3, [2, 4]), (3, [2, 4]), (3, [1, 4]), (3, [1, 4])]) +
          struct.pack("<qqq", 5, 0, 10) + struct.pack("<4i", 0, 1, 2, 3))
    exp = struct.pack("<7i", 0, 1, 2, 3, 4, 5, 6) + struct.pack("<Q", 2) + struct.pack("<2q", 3, 1)
    exp_tensors = [(3, [2, 2]), (3, [2, 5]), (3, [2, 5]), (0, [2, 4]), (0, [2, 4]), (0, [2, 4]), (0, [2])]
    write("cluster", "rollouts", sel_payload("rollouts") + bulk_header(exp_tensors) + b"\1" + exp +
          struct.pack("<qBdqq", 1, 0, 0.25, 6, 0))
    write("cluster", "scores", sel_payload("scores") + bulk_header(exp_tensors + [(0, [2])]) + b"\1" + exp +
          struct.pack("<qBdqq", 1, 0, 0.25, 6, 0) + struct.pack("<i", 7))
    write("cluster", "experience", sel_payload("experience") + bulk_header(exp_tensors + [(0, [2, 4]), (0, [2, 4])]) +
          struct.pack("<qQ", 1, 1) + b"\1" + exp + struct.pack("<iiq", 7, 8, 1))
    counters = struct.pack("<I", 2)
    for n, r in [(0, 1), (1, 0)]:
        counters += struct.pack("<II", n, r) + struct.pack("<10Q", *range(10)) + struct.pack("<I", 1) + \
            struct.pack("<I", 6) + b"tokens" + struct.pack("<q", 42)
    write("cluster", "replica_counters", b"\x01" + counters)
    import hashlib
    import hmac
    tag = hmac.new(b"fuzz-secret", b"fuzz ping 3 17", hashlib.sha256).hexdigest()[:32]
    write("cluster", "liveness_ping", b"\x02" + ("FRLV1 ping 3 17 " + tag).encode())
    write("cluster", "liveness_bad", b"\x02" + b"FRLV1 ping 99999999999 -1 " + b"0" * 32)
    for g in ["rlhf.graph", "pretrain.graph", "sft.graph"]:
        write("cluster", "job_graph_" + g.replace(".graph", ""), b"\x03" + read("graphs", g))


# ---- chat_template -----------------------------------------------------------------------------------------
def gen_chat_template():
    d = os.path.join(FIX, "chat_templates")
    for f in sorted(os.listdir(d)):
        if f.endswith(".jinja"):
            write("chat_template", f[:-len(".jinja")], read("tests", "fixtures", "chat_templates", f))
    for m in ["llama3", "qwen2"]:  # a tokenizer_config.json that holds the template
        write("chat_template", "tokenizer_config_" + m, read("tests", "fixtures", "hf_chat", m, "tokenizer_config.json"))
    # the messages part: tool calls, a list content, a missing role; add_generation_prompt off
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "content": "2"}, {"content": "no role"}]
    write("chat_template", "qwen_tools", parts(read("tests", "fixtures", "chat_templates",
                                                    "Qwen-Qwen2.5-7B-Instruct.jinja"), json.dumps(msgs), "x"))
    write("chat_template", "loops_and_macros", "{% macro m(x) %}[{{ x }}]{% endmacro %}"
          "{% for i in range(3) %}{{ m(i) ~ ('ab' * 2) | replace('a', 'c') }}{% endfor %}"
          "{{ messages | map(attribute='role') | join(',') }}{{ messages[0] | tojson(indent=2) }}")


def main():
    for g in [gen_graph, gen_dschat, gen_lm, gen_ds_config, gen_safetensors, gen_hf, gen_llama2c, gen_adapter,
              gen_tokenizer, gen_hf_tokenizer, gen_console, gen_cluster, gen_chat_template]:
        g()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print("wrote %d files, %d bytes, in %s" % (sum(len(fs) for _, _, fs in os.walk(OUT)), total, OUT))


if __name__ == "__main__":
    main()
