#!/usr/bin/env python3
"""Trains k3-mini-kjv, the small Kimi K3 demonstration model, and writes it.

  python3 tools/reference/train_k3_mini.py --out models/k3-mini-kjv

Seeded and deterministic for a given machine and thread count (torch's CPU
kernels may round differently elsewhere). Needs torch, safetensors, regex and
tiktoken from PyPI and `bible` from Debian's bible-kjv. It writes, into --out:
  config.json, model.safetensors   the bf16 checkpoint (f32 exceptions as deltaserve reads them)
  tiktoken.model, tokenizer_config.json   the byte-level BPE learned from the training text
  held_out.txt                     the held-out chapters (tools/reference/kjv_corpus.py)
  training_log.json                hyper-parameters and the loss curve
and the MXFP4 export (routed experts quantised) into --out + "-mxfp4".
"""

import argparse
import json
import math
import os
import random
import time

import torch

import bpe
import kimi_reference as kr
import kjv_corpus

NUM_RANKS = 1024
# K3's gate is bounded below by -5, so chunks of 8 take the reference's GEMM fast path.
KDA_CHUNK = 8


def model_config(vocab):
    text = {
        "hidden_size": 256,
        "num_hidden_layers": 8,
        "vocab_size": vocab,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "intermediate_size": 512,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_experts": 16,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 64,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 1.0,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "max_position_embeddings": 1048576,
        "linear_attn_config": {
            "num_heads": 4,
            "head_dim": 64,
            "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "full_attn_layers": [4, 8],
            "use_full_rank_gate": True,
            "gate_lower_bound": -5.0,
        },
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "mla_use_output_gate": True,
        "routed_expert_hidden_size": 128,
        "latent_moe_use_norm": True,
        "attn_res_block_size": 4,
    }
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "text_config": text, "torch_dtype": "bfloat16"}


def init_weights(cfg, gen):
    """name -> float32 tensor in the checkpoint's names and shapes."""
    D, L = cfg.hidden, cfg.layers
    w = {}
    std = 0.02
    out_std = std / math.sqrt(2 * L)

    def normal(shape, s=std):
        return torch.randn(*shape, generator=gen) * s

    P = cfg.prefix
    w[P + "embed_tokens.weight"] = normal((cfg.vocab, D))
    w[P + "norm.weight"] = torch.ones(D)
    w[cfg.head_name] = normal((cfg.vocab, D))
    w[P + "output_attn_res_norm.weight"] = torch.ones(D)
    w[P + "output_attn_res_proj.weight"] = torch.zeros(1, D)
    H, d = cfg.kda_heads, cfg.kda_dim
    for i in range(L):
        lp = f"{P}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            w[lp + n + ".weight"] = torch.ones(D)
        w[lp + "self_attention_res_proj.weight"] = torch.zeros(1, D)
        w[lp + "mlp_res_proj.weight"] = torch.zeros(1, D)
        a = lp + "self_attn."
        if cfg.is_kda(i):
            for n in "qkv":
                w[a + f"{n}_proj.weight"] = normal((H * d, D))
                w[a + f"{n}_conv1d.weight"] = (torch.rand(H * d, 1, cfg.conv, generator=gen) - 0.5)
            w[a + "f_a_proj.weight"] = normal((d, D))
            w[a + "f_b_proj.weight"] = normal((H * d, d))
            w[a + "b_proj.weight"] = normal((H, D))
            a_log = torch.zeros(128)
            a_log[:H] = torch.log(torch.empty(H).uniform_(1, 4, generator=gen))
            w[a + "A_log"] = a_log
            # sigmoid(A * dt_bias) between ~0.01 and ~0.1: per-token decays of 0.95 to 0.6.
            w[a + "dt_bias"] = torch.empty(H * d).uniform_(-4.5, -2.2, generator=gen)
            w[a + "g_proj.weight"] = normal((H * d, D))
            w[a + "o_norm.weight"] = torch.ones(d)
            w[a + "o_proj.weight"] = normal((D, H * d), out_std)
        else:
            n, Pn, R, Vd, C = cfg.heads, cfg.nope, cfg.rope, cfg.v_dim, cfg.kv_lora
            w[a + "q_a_proj.weight"] = normal((cfg.q_lora, D))
            w[a + "q_a_layernorm.weight"] = torch.ones(cfg.q_lora)
            w[a + "q_b_proj.weight"] = normal((n * (Pn + R), cfg.q_lora))
            w[a + "kv_a_proj_with_mqa.weight"] = normal((C + R, D))
            w[a + "kv_a_layernorm.weight"] = torch.ones(C)
            w[a + "kv_b_proj.weight"] = normal((n * (Pn + Vd), C))
            w[a + "g_proj.weight"] = normal((n * Vd, D))
            w[a + "o_proj.weight"] = normal((D, n * Vd), out_std)
        if cfg.is_moe(i):
            m = lp + "block_sparse_moe."
            w[m + "gate.weight"] = normal((cfg.experts, D))
            w[m + "gate.e_score_correction_bias"] = torch.zeros(cfg.experts)
            Z, I = cfg.latent, cfg.moe_intermediate
            for e in range(cfg.experts):
                w[m + f"experts.{e}.w1.weight"] = normal((I, Z))
                w[m + f"experts.{e}.w3.weight"] = normal((I, Z))
                w[m + f"experts.{e}.w2.weight"] = normal((Z, I), out_std)
            S = cfg.shared * I
            w[m + "shared_experts.gate_proj.weight"] = normal((S, D))
            w[m + "shared_experts.up_proj.weight"] = normal((S, D))
            w[m + "shared_experts.down_proj.weight"] = normal((D, S), out_std)
            w[m + "routed_expert_down_proj.weight"] = normal((Z, D))
            w[m + "routed_expert_up_proj.weight"] = normal((D, Z), out_std)
            w[m + "routed_expert_norm.weight"] = torch.ones(Z)
        else:
            f = lp + "mlp."
            w[f + "gate_proj.weight"] = normal((cfg.intermediate, D))
            w[f + "up_proj.weight"] = normal((cfg.intermediate, D))
            w[f + "down_proj.weight"] = normal((D, cfg.intermediate), out_std)
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=90.0, help="stop early past this (a slow machine)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    train_text, held_text = kjv_corpus.split()
    ranks = bpe.train_ranks(train_text, NUM_RANKS)
    bpe.write(args.out, ranks)
    with open(os.path.join(args.out, "held_out.txt"), "w") as f:
        f.write(held_text)
    enc = bpe.load(args.out)
    train_ids = torch.tensor(enc.encode_ordinary(train_text), dtype=torch.long)
    held_ids = torch.tensor(enc.encode_ordinary(held_text), dtype=torch.long)
    raw = model_config(NUM_RANKS + bpe.NUM_RESERVED_SPECIAL)
    cfg = kr.Config(raw)

    gen = torch.Generator().manual_seed(args.seed)
    weights = init_weights(cfg, gen)
    params = {n: torch.nn.Parameter(t) for n, t in weights.items() if not n.endswith("e_score_correction_bias")}
    biases = {n: t for n, t in weights.items() if n.endswith("e_score_correction_bias")}
    decay = [p for n, p in params.items() if p.dim() == 2 and "_res_proj" not in n]
    no_decay = [p for n, p in params.items() if not (p.dim() == 2 and "_res_proj" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = 150
    n_params = sum(p.numel() for p in params.values())
    print(f"{n_params / 1e6:.2f}M parameters; {len(train_ids)} training tokens, {len(held_ids)} held out",
          flush=True)

    # Fixed held-out windows for the curve; the full held-out score is deltaserve's.
    held_windows = held_ids[: (len(held_ids) // args.seq) * args.seq].reshape(-1, args.seq)[:32]

    def all_weights():
        return {**params, **biases}

    def held_out_loss():
        with torch.no_grad():
            total = 0.0
            for part in held_windows.split(16):
                logits = kr.forward(cfg, all_weights(), part, dtype=None, chunk=KDA_CHUNK)
                total += kr.log_softmax_nll(logits, part) * len(part)
            return total / len(held_windows)

    curve = []
    start = time.time()
    budget = args.minutes * 60
    step = 0
    tokens_seen = 0
    smoothed = None
    while step < args.steps:
        if time.time() - start > budget:
            print(f"stopping at step {step}: past --minutes {args.minutes}", flush=True)
            break
        progress = step / args.steps
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s: s + args.seq + 1] for s in starts.tolist()])
        loads = {i: torch.zeros(cfg.experts) for i in range(cfg.layers)}
        logits = kr.forward(cfg, all_weights(), batch[:, :-1], dtype=None, chunk=KDA_CHUNK, loads=loads)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        # Auxiliary-loss-free balancing: the bias only selects, and moves towards even load.
        with torch.no_grad():
            for i in range(cfg.first_dense, cfg.layers):
                b = biases[f"{cfg.prefix}layers.{i}.block_sparse_moe.gate.e_score_correction_bias"]
                load = loads[i]
                b += 1e-3 * torch.sign(load.mean() - load)
        step += 1
        tokens_seen += batch[:, 1:].numel()
        smoothed = loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()
        if step % args.eval_every == 0:
            held = held_out_loss()
            curve.append({"step": step, "tokens": tokens_seen, "minutes": round((time.time() - start) / 60, 2),
                          "lr": lr, "train_loss": round(smoothed, 4), "held_out_loss": round(held, 4)})
            print(json.dumps(curve[-1]), flush=True)

    final = {n: t.detach() for n, t in all_weights().items()}
    kr.save_checkpoint(args.out, raw, final)
    mx = args.out.rstrip("/") + "-mxfp4"
    mx_raw = json.loads(json.dumps(raw))
    mx_raw["text_config"]["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "format": "mxfp4-pack-quantized",
            "targets": ["re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"],
            "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                        "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"},
            "input_activations": None, "output_activations": None}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
                   "re:.*routed_expert.*", "re:.*gate$"]}
    kr.save_checkpoint(mx, mx_raw, final, mxfp4_experts=True)
    bpe.write(mx, ranks)
    log = {"seed": args.seed, "threads": args.threads, "parameters": n_params, "steps": step,
           "tokens": tokens_seen, "minutes": round((time.time() - start) / 60, 2),
           "batch": args.batch, "sequence": args.seq, "peak_lr": args.lr, "warmup_steps": warmup,
           "schedule": "linear warmup, cosine to 10% at the last step", "optimizer":
           "AdamW betas (0.9, 0.95), weight decay 0.1 on matrices, gradient clip 1.0",
           "router": "aux-loss-free: e_score_correction_bias += 1e-3 * sign(mean load - load) per step",
           "kda_chunk": KDA_CHUNK, "bpe_ranks": NUM_RANKS, "curve": curve}
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump(log, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} and {mx}", flush=True)


if __name__ == "__main__":
    main()
