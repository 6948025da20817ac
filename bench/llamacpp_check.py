#!/usr/bin/env python3
"""Checks for bench/llamacpp_compare.sh (run in its venv: numpy, safetensors).

    llamacpp_check.py logits REF.safetensors GOT [--max-rel-l2 X] [--label NAME]
        REF: `logits [T, vocab]`, float32 from `deltaserve score --logits-out` or
        float64 from a golden expected_logits.safetensors (or from `reference`);
        GOT: raw float32 [T, vocab] from bench/llamacpp_logits.cpp, or a
        .safetensors with `logits` (deltaserve's). Prints the relative L2 error
        over all logits, the worst row's, the largest absolute difference against
        the largest |logit|, and in how many rows the argmax agrees. Exit 1 when
        the relative L2 error is above --max-rel-l2.

    llamacpp_check.py reference MODEL_DIR IDS OUT.safetensors
        The float64 logits of the comma-separated token ids IDS, from
        tools/reference/kimi_reference.py (needs torch; reads deltaserve's
        checkpoint layout, MXFP4 experts included), written as a golden
        expected_logits.safetensors holds them: `tokens` and `logits [T, vocab]`.

    llamacpp_check.py experts GGUF_PY A.gguf MODEL_DIR
        Every MXFP4 tensor of A (the routed experts, stacked) holds the values of
        MODEL_DIR's compressed-tensors MXFP4 experts (weight_packed +
        weight_scale), and A has as many MXFP4 tensors as the checkpoint has
        expert projections: the converter's repacking lost nothing. Exit 1 on a
        difference.

    llamacpp_check.py weights GGUF_PY A.gguf B.gguf
        Every tensor of A holds the same values as B's (the bf16 GGUF timed
        against the f32 one checked: both from a bf16 checkpoint, so bf16 is
        lossless); tensors of the same type in both (MXFP4 experts) must hold the
        same bytes. GGUF_PY: llama.cpp's gguf-py folder. Exit 1 on a difference.

    llamacpp_check.py table --prompts 512,2048 --decode 64 --depth 128 --threads 2 \
                            [--weights "bf16 weights"] [--decode-batch 1,8,32] \
                            PP.json TG.json MODEL_BENCH.md [PP.json TG.json MODEL_BENCH.md ...]
        The markdown table of tokens/s from one or more rounds (llama-bench -o json
        for prefill and decode, model_bench's report), each figure the best of the
        rounds, with every round's figure beside it; then decode's ceiling, the
        read bandwidth model_bench measured over its weight bytes per token, and
        each side's share of it; then deltaserve's decode of the batches other
        than 1 in --decode-batch (model_bench's tokens/s over all sequences; no
        llama.cpp counterpart). Exit 1 when a figure is missing from a round.
"""

import argparse
import sys

import numpy as np


def check_logits(a: argparse.Namespace) -> int:
    from safetensors.numpy import load_file

    ref = load_file(a.ref)["logits"].astype(np.float64)
    if a.llama.endswith(".safetensors"):
        got = load_file(a.llama)["logits"].astype(np.float64).reshape(-1)
    else:
        got = np.fromfile(a.llama, dtype=np.float32).astype(np.float64)
    if got.size != ref.size:
        print(f"llamacpp_check: {a.llama} holds {got.size} logits, {a.ref} {ref.size} "
              f"{list(ref.shape)}", file=sys.stderr)
        return 1
    got = got.reshape(ref.shape)
    diff = got - ref
    rel = np.linalg.norm(diff) / np.linalg.norm(ref)
    row_rel = np.linalg.norm(diff, axis=1) / np.linalg.norm(ref, axis=1)
    max_abs = np.abs(diff).max() / np.abs(ref).max()
    agree = int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
    ok = rel <= a.max_rel_l2
    print(f"{a.label}: rel L2 {rel:.2e} (worst row {row_rel.max():.2e} at {row_rel.argmax()}), "
          f"max |diff| / max |ref| {max_abs:.2e}, argmax agrees {agree}/{ref.shape[0]}"
          + ("" if ok else f"  ABOVE {a.max_rel_l2:g}"))
    return 0 if ok else 1


def check_weights(a: argparse.Namespace) -> int:
    sys.path.insert(0, a.gguf_py)
    import gguf
    from gguf.quants import dequantize

    def tensors(path):
        return {t.name: t for t in gguf.GGUFReader(path).tensors}

    ta, tb = tensors(a.a), tensors(a.b)
    if set(ta) != set(tb):
        print(f"llamacpp_check: tensor names differ: {sorted(set(ta) ^ set(tb))[:5]}",
              file=sys.stderr)
        return 1
    bad = []
    for name, t in ta.items():
        u = tb[name]
        if t.tensor_type == u.tensor_type and t.tensor_type not in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16):
            # The same quantized type in both (MXFP4 experts): the same bytes.
            if not np.array_equal(t.data, u.data):
                bad.append(name)
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        y = dequantize(u.data, u.tensor_type).astype(np.float32)
        if x.shape != y.shape or not np.array_equal(x, y):
            bad.append(name)
    if bad:
        print(f"llamacpp_check: {len(bad)} tensors differ between {a.a} and {a.b}, "
              f"e.g. {bad[0]}", file=sys.stderr)
        return 1
    print(f"weights: all {len(ta)} tensors of the two GGUFs hold the same values")
    return 0


def reference(a: argparse.Namespace) -> int:
    import os

    import torch
    from safetensors.torch import save_file

    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference")
    sys.path.insert(0, tools)
    import kimi_reference as kr

    tokens = torch.tensor([int(t) for t in a.ids.split(",")], dtype=torch.long)
    cfg, w = kr.load_config(a.model), kr.load_weights(a.model)
    with torch.no_grad():
        # chunk 16: tools/reference/evaluate.py's REFERENCE_CHUNK, the one the
        # goldens were made with.
        logits = kr.forward(cfg, w, tokens[None], dtype=torch.float64, chunk=16)[0]
    save_file({"tokens": tokens, "logits": logits.contiguous()}, a.out)
    print(f"reference: float64 logits of {len(tokens)} tokens of {a.model} in {a.out}")
    return 0


# Compressed-tensors MXFP4: E2M1 codes, the even column in the low nibble, and
# one E8M0 scale (2^(s - 127)) per group of 32 along a row.
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    scale = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)
    return (E2M1[codes].reshape(scale.shape + (32,)) * scale[..., None]).reshape(codes.shape)


def check_experts(a: argparse.Namespace) -> int:
    import os
    import re

    from safetensors import safe_open

    sys.path.insert(0, a.gguf_py)
    import gguf
    from gguf.quants import dequantize

    path = os.path.join(a.model, "model.safetensors")
    pattern = re.compile(r"^(?:language_model\.)?model\.layers\.(\d+)\.block_sparse_moe"
                         r"\.experts\.(\d+)\.(w[123])\.weight_packed$")
    names = {}  # (layer, gguf projection) -> {expert: packed tensor name}
    projection = {"w1": "ffn_gate_exps", "w2": "ffn_down_exps", "w3": "ffn_up_exps"}
    with safe_open(path, "numpy") as f:
        for name in f.keys():
            m = pattern.match(name)
            if m:
                key = (int(m.group(1)), projection[m.group(3)])
                names.setdefault(key, {})[int(m.group(2))] = name
        quantized = {t.name: t for t in gguf.GGUFReader(a.a).tensors
                     if t.tensor_type == gguf.GGMLQuantizationType.MXFP4}
        if not names:
            print(f"llamacpp_check: {path} has no MXFP4 experts", file=sys.stderr)
            return 1
        wanted = {f"blk.{layer}.{proj}.weight" for layer, proj in names}
        if set(quantized) != wanted:
            print(f"llamacpp_check: {a.a}: MXFP4 tensors {sorted(set(quantized) ^ wanted)[:4]} "
                  f"are in only one of it and {path}", file=sys.stderr)
            return 1
        values = 0
        for (layer, proj), experts in sorted(names.items()):
            t = quantized[f"blk.{layer}.{proj}.weight"]
            got = dequantize(t.data, t.tensor_type)  # [experts, rows, cols]
            if got.shape[0] != len(experts):
                print(f"llamacpp_check: {t.name} holds {got.shape[0]} experts, the checkpoint "
                      f"{len(experts)}", file=sys.stderr)
                return 1
            for e in range(got.shape[0]):
                name = experts.get(e)
                want = None if name is None else dequantize_mxfp4(
                    f.get_tensor(name), f.get_tensor(name[:-len("_packed")] + "_scale"))
                if want is None or want.shape != got[e].shape or not np.array_equal(want, got[e]):
                    print(f"llamacpp_check: {t.name} expert {e} does not hold {name}'s values",
                          file=sys.stderr)
                    return 1
            values += got.size
    print(f"experts: all {len(quantized)} MXFP4 tensors of the GGUF ({values / 1e6:.1f} M values) "
          f"hold the checkpoint's MXFP4 experts exactly")
    return 0


def table(a: argparse.Namespace) -> int:
    import json
    import re

    prompts = [int(p) for p in a.prompts.split(",")]
    if len(a.files) % 3:
        print("llamacpp_check: table wants files in threes", file=sys.stderr)
        return 1
    batches = [int(b) for b in a.decode_batch.split(",") if int(b) != 1]
    llama, ds = {}, {}  # (kind, tokens) -> tokens/s of each round
    batch_rows = {}  # decode batch -> model_bench's words for it
    ceiling = []  # per round: read bandwidth / weight bytes per token
    for i in range(0, len(a.files), 3):
        pp, tg, md = a.files[i:i + 3]
        for path in (pp, tg):
            with open(path) as f:
                for t in json.load(f):
                    key = ("pp", t["n_prompt"]) if t["n_prompt"] > 0 else ("tg", t["n_gen"])
                    llama.setdefault(key, []).append(t["avg_ts"])
        with open(md) as f:
            text = f.read()
        # The first prefill row is model_bench's warm-up run.
        for tokens, ts in re.findall(r"^\| (\d+) \| [\d.]+ \| ([\d.]+) \|", text, re.M)[1:]:
            ds.setdefault(("pp", int(tokens)), []).append(float(ts))
        for what, batch, ts in re.findall(
                r"^\| (\d+ steps of (\d+) sequences after \d+ tokens each) \| ([\d.]+) \|",
                text, re.M):
            ds.setdefault(("batch", int(batch)), []).append(float(ts))
            batch_rows[int(batch)] = what
        m = re.search(r"^\| \d+ steps after \d+ tokens \| ([\d.]+) \| ([\d.]+) MB \|", text, re.M)
        if m:
            ds.setdefault(("tg", a.decode), []).append(float(m.group(1)))
            bw = re.search(r"^- memory read bandwidth: ([\d.]+) GB/s", text, re.M)
            if bw:
                # Tokens/s of a decode that only read the weights, at the
                # bandwidth measured in this round.
                ceiling.append(float(bw.group(1)) * 1e3 / float(m.group(2)))

    def spread(v):
        return ", ".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in v)

    rounds = len(a.files) // 3
    print(f"\n| {a.threads} threads, {a.weights}, best of {rounds} | llama.cpp tokens/s "
          "| deltaserve tokens/s | deltaserve / llama.cpp | each round: llama.cpp "
          "| each round: deltaserve |")
    print("|---|---|---|---|---|---|")
    names = [(("pp", p), f"prefill {p}") for p in prompts]
    names.append((("tg", a.decode), f"decode {a.decode} after {a.depth}"))
    for key, name in names:
        x, y = llama.get(key, []), ds.get(key, [])
        if len(x) != rounds or len(y) != rounds:
            print(f"llamacpp_check: {name}: {len(x)} llama.cpp and {len(y)} deltaserve figures "
                  f"for {rounds} rounds", file=sys.stderr)
            return 1
        print(f"| {name} | {max(x):.1f} | {max(y):.1f} | {max(y) / max(x):.2f}x "
              f"| {spread(x)} | {spread(y)} |")
    if len(ceiling) == rounds:
        # Decode reads every active weight once a token, the same tensors on
        # both sides (bf16; MXFP4 experts take 17 bytes per 32 values in both
        # layouts): reading them from memory, no program decodes faster than
        # the bandwidth allows.
        x, y = llama[("tg", a.decode)], ds[("tg", a.decode)]

        def share(v):
            return ", ".join(f"{t / c:.0%}" for t, c in zip(v, ceiling))

        most = ", ".join(f"{c / t:.2f}x" for t, c in zip(x, ceiling))
        print(f"\ndecode ceiling (model_bench's read bandwidth / its weight bytes per token), "
              f"each round: {spread(ceiling)} tokens/s; llama.cpp at {share(x)} of it, "
              f"deltaserve at {share(y)}; the most deltaserve could be ahead at that "
              f"bandwidth: {most}")
    if batches:
        # llama-bench times one sequence: these have no llama.cpp column.
        print(f"\n| {a.threads} threads, {a.weights}, best of {rounds} | deltaserve tokens/s, "
              "all sequences | each round |")
        print("|---|---|---|")
        for b in batches:
            y = ds.get(("batch", b), [])
            if len(y) != rounds:
                print(f"llamacpp_check: decode batch {b}: {len(y)} deltaserve figures for "
                      f"{rounds} rounds", file=sys.stderr)
                return 1
            print(f"| decode, {batch_rows[b]} | {max(y):.1f} | {spread(y)} |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("ref")
    lg.add_argument("llama")
    lg.add_argument("--max-rel-l2", type=float, default=float("inf"))
    lg.add_argument("--label", default="logits")
    wt = sub.add_parser("weights")
    wt.add_argument("gguf_py")
    wt.add_argument("a")
    wt.add_argument("b")
    rf = sub.add_parser("reference")
    rf.add_argument("model")
    rf.add_argument("ids")
    rf.add_argument("out")
    ex = sub.add_parser("experts")
    ex.add_argument("gguf_py")
    ex.add_argument("a")
    ex.add_argument("model")
    tb = sub.add_parser("table")
    tb.add_argument("--prompts", required=True)
    tb.add_argument("--decode", type=int, required=True)
    tb.add_argument("--depth", type=int, required=True)
    tb.add_argument("--threads", required=True)
    tb.add_argument("--weights", default="bf16 weights")
    tb.add_argument("--decode-batch", default="1")
    tb.add_argument("files", nargs="+")
    a = p.parse_args()
    return {"logits": check_logits, "weights": check_weights, "reference": reference,
            "experts": check_experts, "table": table}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
