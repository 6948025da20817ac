#!/usr/bin/env python3
"""KDA chunked prefill on a GPU: deltaserve's KdaChunk against flash-linear-attention's chunk_kda.

Times chunk_kda (fla.ops.kda, from the fla-core package: torch and triton, nothing else
compiled) on the shapes `kda_bench --device cuda` runs, and when --kda-bench names that
program, runs it on the same shapes, then prints one markdown table of both.

    python3 bench/fla_kda_compare.py --kda-bench build/bin/kda_bench \
        [--tokens 4096,32768] [--heads 96] [--variants bf16,bf16-safe,f32]

Inputs are drawn as kda_bench draws them (not the same values): q and k uniform in [-1, 1)
then L2-normalised per head, v uniform in [-1, 1), the log-decay g uniform in [-1, -0.001)
(K3's gate is bounded below by -5), beta uniform in [0.01, 0.99), an initial state uniform in
[-1, 1), scale K^-0.5, and the final state is returned, as a prefill needs. deltaserve's kernel
takes float32 inputs and keeps the state in float32; chunk_kda is timed on the variants asked
for: bf16 or f32 inputs, and bf16-safe (bf16 with safe_gate and lower_bound -5, its faster
path for bounded gates such as K3's). Each time is the best of --repeats calls after one
warm-up (which includes triton's autotuning). Exits 1 if anything failed; the table still
shows what ran.
"""

import argparse
import re
import subprocess
import sys
import time


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def time_chunk_kda(torch, chunk_kda, t, heads, dim, variant, repeats):
    """Best milliseconds of chunk_kda at [1, t, heads, dim] for one variant."""
    dtype = torch.float32 if variant == "f32" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(1)

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, device="cuda", dtype=torch.float32) * (hi - lo) + lo

    q = torch.nn.functional.normalize(uniform((1, t, heads, dim), -1, 1), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(uniform((1, t, heads, dim), -1, 1), dim=-1).to(dtype)
    v = uniform((1, t, heads, dim), -1, 1).to(dtype)
    g = uniform((1, t, heads, dim), -1.0, -0.001).to(dtype)
    beta = uniform((1, t, heads), 0.01, 0.99).to(dtype)
    h0 = uniform((1, heads, dim, dim), -1, 1)
    extra = {"safe_gate": True, "lower_bound": -5.0} if variant == "bf16-safe" else {}

    def call():
        return chunk_kda(q=q, k=k, v=v, g=g, beta=beta, scale=dim ** -0.5, initial_state=h0,
                         output_final_state=True, **extra)

    best = float("inf")
    with torch.inference_mode():
        for rep in range(repeats + 1):  # the first warms up (and autotunes)
            torch.cuda.synchronize()
            start = time.perf_counter()
            o, _ = call()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            if rep > 0:
                best = min(best, ms)
    if not torch.isfinite(o.float()).all():
        raise RuntimeError("chunk_kda's output is not finite")
    return best


def run_kda_bench(path, tokens, heads):
    """{t: ms} of kda_bench --device cuda, or raises with what it said."""
    cmd = [path, "0", "--device", "cuda", "--tokens", ",".join(map(str, tokens)),
           "--heads", str(heads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    times = {int(m.group(1)): float(m.group(2))
             for m in re.finditer(r"KdaChunk T=(\d+)\s+([\d.]+) ms", proc.stdout)}
    missing = [t for t in tokens if t not in times]
    if missing:
        raise RuntimeError(f"{' '.join(cmd)} printed no time for T={missing}")
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="4096,32768", help="prompt lengths")
    parser.add_argument("--heads", type=int, default=96, help="H = HV (K3: 96)")
    parser.add_argument("--dim", type=int, default=128, help="K = V (K3: 128)")
    parser.add_argument("--variants", default="bf16,bf16-safe,f32",
                        help="chunk_kda's inputs: bf16, bf16-safe, f32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kda-bench", help="deltaserve's kda_bench, run on the same shapes")
    args = parser.parse_args()
    tokens = parse_list(args.tokens)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in ("bf16", "bf16-safe", "f32"):
            parser.error(f"unknown variant {v!r}")

    failures = []
    rows = []  # (t, implementation, inputs, ms or error)
    ours = {}
    if args.kda_bench:
        if args.dim != 128:
            parser.error("kda_bench runs K = V = 128 only")
        try:
            ours = run_kda_bench(args.kda_bench, tokens, args.heads)
        except Exception as e:  # noqa: BLE001: reported in the table
            failures.append(f"deltaserve KdaChunk: {e}")
            ours = {t: f"failed: {e}" for t in tokens}

    versions = "chunk_kda not importable"
    try:
        import torch
        import triton
        import fla
        from fla.ops.kda import chunk_kda
        versions = (f"fla-core {fla.__version__}, torch {torch.__version__}, "
                    f"triton {triton.__version__}, {torch.cuda.get_device_name()}")
    except Exception as e:  # noqa: BLE001: reported in the table
        failures.append(f"import chunk_kda: {e}")
        chunk_kda = None

    theirs = {}
    for t in tokens:
        for variant in variants:
            if chunk_kda is None:
                theirs[t, variant] = "not run: chunk_kda not importable"
                continue
            try:
                theirs[t, variant] = time_chunk_kda(torch, chunk_kda, t, args.heads, args.dim,
                                                    variant, args.repeats)
            except Exception as e:  # noqa: BLE001: reported in the table
                failures.append(f"chunk_kda {variant} T={t}: {e}")
                theirs[t, variant] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            finally:
                if chunk_kda is not None:
                    torch.cuda.empty_cache()

    print(f"## KDA chunked prefill: deltaserve KdaChunk against chunk_kda "
          f"(H = HV = {args.heads}, K = V = {args.dim}, one sequence)\n")
    print(f"- {versions}\n")
    print("| tokens | implementation | inputs | ms | tokens/s | deltaserve's time / this |")
    print("|---|---|---|---|---|---|")

    def cells(value, t, base):
        if isinstance(value, str):
            return f"{value} | | "
        ratio = f"{base / value:.2f}" if isinstance(base, float) else ""
        return f"{value:.2f} | {t / (value * 1e-3):.0f} | {ratio}"

    for t in tokens:
        base = ours.get(t)
        if args.kda_bench:
            rows.append(f"| {t} | deltaserve KdaChunk | f32, f32 state | {cells(base, t, base)} |")
        for variant in variants:
            inputs = {"bf16": "bf16, f32 state", "bf16-safe": "bf16, safe_gate, f32 state",
                      "f32": "f32, f32 state"}[variant]
            rows.append(f"| {t} | fla chunk_kda | {inputs} | {cells(theirs[t, variant], t, base)} |")
    print("\n".join(rows))
    if failures:
        print("\nFAILED:")
        for f in failures:
            print(f"- {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
