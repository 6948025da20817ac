#!/usr/bin/env python3
"""Checks for bench/llamacpp_compare.sh (run in its venv: numpy, safetensors).

    llamacpp_check.py logits REF.safetensors LLAMA.f32 [--max-rel-l2 X] [--label NAME]
        REF: `logits [T, vocab]`, float32 from `deltaserve score --logits-out` or
        float64 from a golden expected_logits.safetensors; LLAMA: raw float32
        [T, vocab] from bench/llamacpp_logits.cpp. Prints the relative L2 error
        over all logits, the worst row's, the largest absolute difference against
        the largest |logit|, and in how many rows the argmax agrees. Exit 1 when
        the relative L2 error is above --max-rel-l2.

    llamacpp_check.py weights GGUF_PY A.gguf B.gguf
        Every tensor of A holds the same values as B's (the bf16 GGUF timed
        against the f32 one checked: both from a bf16 checkpoint, so bf16 is
        lossless). GGUF_PY: llama.cpp's gguf-py folder. Exit 1 on a difference.

    llamacpp_check.py table --prompts 512,2048 --decode 64 --depth 128 --threads 2 \
                            PP.json TG.json MODEL_BENCH.md [PP.json TG.json MODEL_BENCH.md ...]
        The markdown table of tokens/s from one or more rounds (llama-bench -o json
        for prefill and decode, model_bench's report), each figure the best of the
        rounds, with every round's figure beside it; then decode's ceiling, the
        read bandwidth model_bench measured over its weight bytes per token, and
        each side's share of it. Exit 1 when a figure is missing from a round.
"""

import argparse
import sys

import numpy as np


def check_logits(a: argparse.Namespace) -> int:
    from safetensors.numpy import load_file

    ref = load_file(a.ref)["logits"].astype(np.float64)
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


def table(a: argparse.Namespace) -> int:
    import json
    import re

    prompts = [int(p) for p in a.prompts.split(",")]
    if len(a.files) % 3:
        print("llamacpp_check: table wants files in threes", file=sys.stderr)
        return 1
    llama, ds = {}, {}  # (kind, tokens) -> tokens/s of each round
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
    print(f"\n| {a.threads} threads, bf16 weights, best of {rounds} | llama.cpp tokens/s "
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
        # Decode reads every active weight once a token, the same bf16 tensors
        # on both sides: reading them from memory, no program decodes faster
        # than the bandwidth allows.
        x, y = llama[("tg", a.decode)], ds[("tg", a.decode)]

        def share(v):
            return ", ".join(f"{t / c:.0%}" for t, c in zip(v, ceiling))

        most = ", ".join(f"{c / t:.2f}x" for t, c in zip(x, ceiling))
        print(f"\ndecode ceiling (model_bench's read bandwidth / its weight bytes per token), "
              f"each round: {spread(ceiling)} tokens/s; llama.cpp at {share(x)} of it, "
              f"deltaserve at {share(y)}; the most deltaserve could be ahead at that "
              f"bandwidth: {most}")
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
    tb = sub.add_parser("table")
    tb.add_argument("--prompts", required=True)
    tb.add_argument("--decode", type=int, required=True)
    tb.add_argument("--depth", type=int, required=True)
    tb.add_argument("--threads", required=True)
    tb.add_argument("files", nargs="+")
    a = p.parse_args()
    return {"logits": check_logits, "weights": check_weights, "table": table}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
