#!/usr/bin/env python3
"""Measures a trained model on its held-out text: the PyTorch reference against deltaserve.

  python3 tools/reference/evaluate.py reference-logits models/k3-mini-kjv
      expected_logits.safetensors in the model directory and its MXFP4 export: the first
      --tokens tokens of held_out.txt and the reference's float64 logits of them, as the
      golden files hold them (tests/runtime/model/model_golden_test.cc reads them)
  python3 tools/reference/evaluate.py agreement models/k3-mini-kjv
      the reference (float32 and float64) against `deltaserve score --logits-out` on each
      model's expected_logits prompt: the goldens' models and the trained model with its export
  python3 tools/reference/evaluate.py report models/k3-mini-kjv
      the README's tables from training_log.json and evaluation.json
  python3 tools/reference/evaluate.py numerics models/k3-mini-kjv
      evaluation.json: held-out perplexity and top-1 agreement with the float64 reference,
      for PyTorch float32 and for each way deltaserve runs (tests/launcher/trained_model_test.cc
      runs the same configurations and checks the perplexities), and the long-context scan

Scoring cuts held_out.txt into independent windows of the training length
(`deltaserve score --window`); the long-context scan scores it as one sequence.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import kimi_reference as kr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WINDOW = 256
# The reference's KDA chunk: its float32 solve of (I + L) loses accuracy on longer chunks
# (k3-tiny-mxfp4: 2.6e-4 relative L2 at 64 against 2.9e-5 at 16).
REFERENCE_CHUNK = 16
# (name, model directory suffix, deltaserve flags, MPI ranks): the test runs these too.
CONFIGS = [
    ("deltaserve float32", "", "", 1),
    ("bf16 compute", "", "--compute-dtype bf16", 1),
    ("bf16 MLA cache", "", "--kv-cache-dtype bf16", 1),
    ("MXFP4 experts", "-mxfp4", "", 1),
    ("MXFP4 + bf16 compute + bf16 cache", "-mxfp4", "--compute-dtype bf16 --kv-cache-dtype bf16", 1),
    ("PP2 x TP2, prefill chunks of 100", "", "--pp 2 --tp 2 --prefill-chunk 100", 4),
    ("PP2 x TP2, bf16 stage boundary", "", "--pp 2 --tp 2 --prefill-chunk 100 --boundary-dtype bf16", 4),
]
LONG_BUCKETS = [0, 256, 1024, 4096, 16384]


def held_out_tokens(model_dir):
    with open(os.path.join(model_dir, "held_out.txt")) as f:
        text = f.read()
    return bpe.load(model_dir).encode_ordinary(text)


def reference_logits(args):
    tokens = torch.tensor(held_out_tokens(args.model)[: args.tokens], dtype=torch.long)
    for d in (args.model, args.model.rstrip("/") + "-mxfp4"):
        cfg, w = kr.load_config(d), kr.load_weights(d)
        with torch.no_grad():
            logits = kr.forward(cfg, w, tokens[None], dtype=torch.float64, chunk=REFERENCE_CHUNK)[0]
        save_file({"tokens": tokens.to(torch.int64), "logits": logits.contiguous()},
                  os.path.join(d, "expected_logits.safetensors"))
        print(f"{d}: {len(tokens)} tokens", flush=True)


def agreement(args):
    golden = os.path.join(ROOT, "..", "shared", "golden", "model")
    dirs = [os.path.join(golden, n) for n in sorted(os.listdir(golden))]
    dirs += [args.model, args.model.rstrip("/") + "-mxfp4"]
    rows = []
    for d in dirs:
        tokens = load_file(os.path.join(d, "expected_logits.safetensors"))["tokens"].long()
        cfg, w = kr.load_config(d), kr.load_weights(d)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "logits.safetensors")
            subprocess.run([args.deltaserve, "score", "--model", d, "--tokens",
                            ",".join(str(t) for t in tokens.tolist()), "--logits-out", out], check=True)
            ours = load_file(out)["logits"]
        with torch.no_grad():
            f64 = kr.forward(cfg, w, tokens[None], dtype=torch.float64, chunk=REFERENCE_CHUNK)[0]
            f32 = kr.forward(cfg, w, tokens[None], dtype=torch.float32, chunk=REFERENCE_CHUNK)[0]
        rows.append((os.path.basename(d.rstrip("/")), len(tokens), kr.relative_l2(ours, f32),
                     kr.relative_l2(ours, f64), kr.relative_l2(f32, f64)))
    print("| model | tokens | deltaserve vs reference float32 | deltaserve vs reference float64 "
          "| reference float32 vs float64 |")
    print("|---|---|---|---|---|")
    for name, n, a, b, c in rows:
        print(f"| {name} | {n} | `{a:.2e}` | `{b:.2e}` | `{c:.2e}` |")


def report(args):
    """The README's tables, from training_log.json and evaluation.json."""
    with open(os.path.join(args.model, "training_log.json")) as f:
        log = json.load(f)
    print("| step | tokens seen | minutes | learning rate | training loss (smoothed) | held-out loss |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in log["curve"]:
        print(f"| {row['step']} | {row['tokens']:,} | {row['minutes']:.1f} | {row['lr']:.2e} "
              f"| {row['train_loss']:.3f} | {row['held_out_loss']:.3f} |")
    with open(os.path.join(args.model, "evaluation.json")) as f:
        ev = json.load(f)
    print()
    print("| how it runs | perplexity | top-1 equal to float64 | largest log-prob difference |")
    print("|---|---:|---:|---:|")
    for c in ev["configs"]:
        print(f"| {c['name']} | {c['perplexity']:.3f} | {100 * c['top1_agreement']:.2f}% "
              f"| `{c['max_abs_logprob_difference']:.2g}` |")
    print()
    print("| positions | perplexity | all finite |")
    print("|---|---:|---|")
    for b in ev["long_context"]:
        print(f"| {b['positions'][0]:,}-{b['positions'][1]:,} | {b['perplexity']:.3f} | {b['finite']} |")


def windows(tokens):
    return [tokens[i: i + WINDOW] for i in range(0, len(tokens), WINDOW)]


def reference_scores(model_dir, tokens, dtype):
    """Per scored position: (log-prob of the next token, argmax), windows in turn."""
    cfg, w = kr.load_config(model_dir), kr.load_weights(model_dir)
    logprobs, top = [], []
    with torch.no_grad():
        for win in windows(tokens):
            t = torch.tensor(win, dtype=torch.long)[None]
            lg = kr.forward(cfg, w, t, dtype=dtype, chunk=REFERENCE_CHUNK)[0].double()
            lp = torch.log_softmax(lg[:-1], -1)
            logprobs.append(lp.gather(-1, t[0, 1:, None])[:, 0])
            top.append(lg[:-1].argmax(-1))
    return torch.cat(logprobs), torch.cat(top)


def deltaserve_scores(binary, model_dir, text, flags, ranks, window=WINDOW):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lp.safetensors")
        cmd = [binary, "score", "--model", model_dir, "--prompt-file", text,
               "--window", str(window), "--top-k", "1", "--logprobs-out", out] + flags.split()
        if ranks > 1:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + cmd + ["--threads", "1"]
        subprocess.run(cmd, check=True)
        o = load_file(out)
        return o["logprobs"].double(), o["top_ids"][:, 0].long()


def perplexity(logprobs):
    return math.exp(-logprobs.mean().item())


def numerics(args):
    model = os.path.abspath(args.model)
    text = os.path.join(model, "held_out.txt")
    tokens = held_out_tokens(model)
    ref_lp, ref_top = reference_scores(model, tokens, torch.float64)
    results = {"window": WINDOW, "held_out_tokens": len(tokens), "scored_positions": len(ref_lp),
               "configs": []}

    def add(name, flags, ranks, lp, top, suffix=""):
        entry = {"name": name, "model_suffix": suffix, "flags": flags, "ranks": ranks,
                 "perplexity": round(perplexity(lp), 4),
                 "top1_agreement": round((top == ref_top).double().mean().item(), 5),
                 "max_abs_logprob_difference": float(f"{(lp - ref_lp).abs().max().item():.3g}")}
        results["configs"].append(entry)
        print(json.dumps(entry), flush=True)

    add("PyTorch float64 (the reference)", None, 0, ref_lp, ref_top)
    lp, top = reference_scores(model, tokens, torch.float32)
    add("PyTorch float32", None, 0, lp, top)
    for name, suffix, flags, ranks in CONFIGS:
        lp, top = deltaserve_scores(args.deltaserve, model + suffix, text, flags, ranks)
        add(name, flags, ranks, lp, top, suffix)

    # Past the training length: the whole held-out text as one sequence.
    lp, _ = deltaserve_scores(args.deltaserve, model, text, "", 1, window=0)
    scan = []
    bounds = [b for b in LONG_BUCKETS if b < len(lp)] + [len(lp)]
    for lo, hi in zip(bounds, bounds[1:]):
        part = lp[lo:hi]
        scan.append({"positions": [lo + 1, hi], "perplexity": round(perplexity(part), 4),
                     "finite": bool(torch.isfinite(part).all().item())})
        print(json.dumps(scan[-1]), flush=True)
    results["long_context"] = scan
    with open(os.path.join(model, "evaluation.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["reference-logits", "agreement", "numerics", "report"])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--deltaserve", default=os.path.join(ROOT, "build/bin/deltaserve"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    {"reference-logits": reference_logits, "agreement": agreement, "numerics": numerics,
     "report": report}[args.what](args)


if __name__ == "__main__":
    main()
