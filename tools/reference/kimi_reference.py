"""A PyTorch reference of the two model architectures deltaserve serves.

Written from the math of the team's model description (Kimi K3 with Block
Attention Residuals, latent MoE and gated NoPE MLA; Kimi Linear with a plain
residual stream), and reading and writing checkpoints in the layout deltaserve
loads: `config.json` (K3's fields under `text_config`) and one
`model.safetensors` with bf16 weights, the f32 exceptions (`A_log`, `dt_bias`,
the short-convolution weights, `o_norm`, the router bias) and optionally MXFP4
routed experts (`weight_packed` + `weight_scale`).

The same code trains (float32, autograd) and serves as the float64 reference
(`forward(..., dtype=torch.float64)`): KDA runs in its chunk form, exponentiating
only differences of cumulative log-decays that are <= 0, so it stays finite for
any decay.
"""

import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

# --- config -----------------------------------------------------------------


class Config:
    """The fields of config.json the math needs (K3: text_config)."""

    def __init__(self, raw):
        self.raw = raw
        self.model_type = raw.get("model_type", "kimi_linear")
        self.k3 = self.model_type == "kimi_k3"
        c = raw["text_config"] if self.k3 else raw
        self.text = c
        self.hidden = c["hidden_size"]
        self.layers = c["num_hidden_layers"]
        self.vocab = c["vocab_size"]
        self.eps = c["rms_norm_eps"]
        self.heads = c["num_attention_heads"]
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora = c["kv_lora_rank"]
        self.nope = c["qk_nope_head_dim"]
        self.rope = c["qk_rope_head_dim"]
        self.v_dim = c["v_head_dim"]
        self.intermediate = c["intermediate_size"]
        self.first_dense = c.get("first_k_dense_replace", 0)
        self.experts = c["num_experts"]
        self.top_k = c["num_experts_per_token"]
        self.shared = c.get("num_shared_experts", 0)
        self.moe_intermediate = c["moe_intermediate_size"]
        self.scaling = c.get("routed_scaling_factor", 1.0)
        self.act = c.get("hidden_act", "silu")
        self.situ_beta = c.get("activation_situ_beta", 4.0)
        self.situ_linear_beta = c.get("activation_situ_linear_beta", 25.0)
        self.latent = c.get("routed_expert_hidden_size", 0) or 0
        self.latent_norm = c.get("latent_moe_use_norm", False)
        self.mla_gate = c.get("mla_use_output_gate", False)
        self.block = c.get("attn_res_block_size", 0) or 0
        la = c["linear_attn_config"]
        self.kda_heads = la["num_heads"]
        self.kda_dim = la["head_dim"]
        self.conv = la.get("short_conv_kernel_size", 4)
        # 1-indexed in the file.
        self.kda_layers = {i - 1 for i in la["kda_layers"]}
        self.full_rank_gate = la.get("use_full_rank_gate", False)
        self.lower_bound = la.get("gate_lower_bound")
        self.prefix = "language_model.model." if self.k3 else "model."
        self.head_name = "language_model.lm_head.weight" if self.k3 else "lm_head.weight"

    def is_kda(self, i):
        return i in self.kda_layers

    def is_moe(self, i):
        return i >= self.first_dense


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return Config(json.load(f))


# --- MXFP4 (OCP microscaling: E2M1 codes, E8M0 scale per 32 values) ----------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
GROUP = 32


def dequantize_mxfp4(packed, scales):
    """packed U8 [out, in/2] (even column in the low nibble), scales U8 [out, in/32]."""
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    values = E2M1[codes]
    exponent = scales.double() - 127.0
    values = values.reshape(packed.shape[0], -1, GROUP) * torch.pow(2.0, exponent).unsqueeze(-1)
    return values.reshape(packed.shape[0], -1)


def quantize_mxfp4(w):
    """The scale 2^e is the smallest that brings each group's largest magnitude within 6;
    each value gets the nearest code (ties to the smaller magnitude)."""
    w = w.double()
    rows, cols = w.shape
    assert cols % GROUP == 0, "MXFP4 rows split into groups of 32"
    g = w.reshape(rows, cols // GROUP, GROUP)
    amax = g.abs().amax(-1)
    mantissa, exponent = torch.frexp(amax / 6.0)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent)).clamp(-127, 127)
    scale = torch.pow(2.0, exponent.double()).unsqueeze(-1)
    magnitude = (g.abs() / scale).unsqueeze(-1)
    code = (magnitude - E2M1[:8]).abs().argmin(-1)  # first minimum: the smaller code on ties
    code = torch.where((g < 0) & (code != 0), code | 8, code).reshape(rows, cols)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed, (exponent + 127).to(torch.uint8)


# --- checkpoints ---------------------------------------------------------------

# Tensors deltaserve reads in float32; everything else non-MXFP4 is bf16.
F32_SUFFIXES = ("A_log", "dt_bias", "conv1d.weight", "o_norm.weight", "e_score_correction_bias")


def is_f32(name):
    return name.endswith(F32_SUFFIXES)


def load_weights(model_dir):
    """name -> float64 tensor; MXFP4 experts dequantised (exactly: codes x powers of two)."""
    raw = load_file(os.path.join(model_dir, "model.safetensors"))
    out = {}
    for name, t in raw.items():
        if name.endswith("_packed"):
            base = name[: -len("_packed")]
            out[base] = dequantize_mxfp4(t, raw[base + "_scale"])
        elif name.endswith("_scale"):
            continue
        else:
            out[name] = t.double()
    return out


def save_checkpoint(model_dir, config_raw, weights, mxfp4_experts=False):
    """Writes config.json and model.safetensors in deltaserve's layout."""
    os.makedirs(model_dir, exist_ok=True)
    tensors = {}
    for name, t in weights.items():
        t = t.detach().cpu()
        if mxfp4_experts and ".experts." in name and name.endswith(("w1.weight", "w2.weight", "w3.weight")):
            packed, scales = quantize_mxfp4(t)
            tensors[name + "_packed"] = packed.contiguous()
            tensors[name + "_scale"] = scales.contiguous()
        elif is_f32(name):
            tensors[name] = t.float().contiguous()
        else:
            tensors[name] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, os.path.join(model_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config_raw, f, indent=2)
        f.write("\n")


# --- building blocks ------------------------------------------------------------


def rms_norm(x, w, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if w is None else x * w


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def linear(x, w):
    return x @ w.t()


def short_conv(x, w):
    """Causal depthwise convolution: x [B, T, C], w [C, 1, K]."""
    K = w.shape[-1]
    y = F.conv1d(x.transpose(1, 2), w.to(x.dtype), groups=x.shape[-1], padding=K - 1)
    return y[..., : x.shape[1]].transpose(1, 2)


def activation(cfg, g, u):
    if cfg.act == "situ":
        b, lb = cfg.situ_beta, cfg.situ_linear_beta
        return b * torch.tanh(g / b) * torch.sigmoid(g) * lb * torch.tanh(u / lb)
    return F.silu(g) * u


# --- KDA -----------------------------------------------------------------------


def kda_recurrent(q, k, v, g, beta, state=None):
    """The token-by-token delta rule. q,k,v,g [B, H, T, d]; beta [B, H, T]."""
    B, H, T, d = q.shape
    S = q.new_zeros(B, H, d, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp().unsqueeze(-1)
        u = v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t])
        S = S + beta[:, :, t, None, None] * k[:, :, t].unsqueeze(-1) * u.unsqueeze(-2)
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return torch.stack(out, dim=2), S


def kda_chunked(q, k, v, g, beta, chunk=16, state=None, min_log_decay=None):
    """The chunk form of the same recurrence (MODEL.md); equal to kda_recurrent to rounding.

    min_log_decay: a lower bound of g (K3's gate_lower_bound), when there is one."""
    B, H, T, d = q.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:
        # Zero keys write nothing and zero log-decays keep the state: the end state is exact.
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    N = q.shape[2] // chunk
    q, k, v, g = (x.reshape(B, H, N, chunk, -1) for x in (q, k, v, g))
    beta = beta.reshape(B, H, N, chunk)
    G = g.cumsum(-2)  # [B, H, N, C, d], <= 0 and decreasing
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device))
    if min_log_decay is not None and -min_log_decay * chunk <= 40:
        # Training's fast path: with every g_t >= min_log_decay, exp(-G_j) <= e^40 inside a
        # chunk, so exp(G_i - G_j) = exp(G_i) exp(-G_j) stays finite and the products are GEMMs.
        def pair(a, b):
            return (a * G.exp()) @ (b * (-G).exp()).transpose(-1, -2)
    else:
        diff = G.unsqueeze(-2) - G.unsqueeze(-3)  # [.., i, j, d] = G_i - G_j
        # Only exponentiate where j <= i (difference <= 0); elsewhere the entry is masked.
        decay = torch.where(lower[..., None], diff, torch.zeros_like(diff)).exp()

        def pair(a, b):
            return torch.einsum("bhnic,bhnjc,bhnijc->bhnij", a, b, decay)
    kk = pair(k, k)
    strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), -1)
    L = torch.where(strict, kk * beta.unsqueeze(-1), torch.zeros_like(kk))
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs_w = beta.unsqueeze(-1) * k * G.exp()
    rhs_u = beta.unsqueeze(-1) * v
    W = torch.linalg.solve_triangular(eye + L, rhs_w, upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(eye + L, rhs_u, upper=False, unitriangular=True)
    Aqk = pair(q, k)
    Aqk = torch.where(lower, Aqk, torch.zeros_like(Aqk))
    S = q.new_zeros(B, H, d, dv) if state is None else state
    Gl = G[:, :, :, -1:, :]  # [B, H, N, 1, d]
    k_tail = k * (Gl - G).exp()
    q_head = q * G.exp()
    outs = []
    for n in range(N):
        Vn = U[:, :, n] - W[:, :, n] @ S
        outs.append(q_head[:, :, n] @ S + Aqk[:, :, n] @ Vn)
        S = Gl[:, :, n, 0].exp().unsqueeze(-1) * S + k_tail[:, :, n].transpose(-1, -2) @ Vn
    o = torch.stack(outs, dim=2).reshape(B, H, N * chunk, dv)[:, :, :T]
    return o, S


def kda_layer(cfg, w, p, x, chunk):
    B, T, _ = x.shape
    H, d = cfg.kda_heads, cfg.kda_dim

    def heads(t):
        return t.reshape(B, T, H, -1).transpose(1, 2)

    q = F.silu(short_conv(linear(x, w[p + "q_proj.weight"]), w[p + "q_conv1d.weight"]))
    k = F.silu(short_conv(linear(x, w[p + "k_proj.weight"]), w[p + "k_conv1d.weight"]))
    v = F.silu(short_conv(linear(x, w[p + "v_proj.weight"]), w[p + "v_conv1d.weight"]))
    q = l2norm(heads(q)) * d ** -0.5
    k = l2norm(heads(k))
    v = heads(v)
    graw = linear(linear(x, w[p + "f_a_proj.weight"]), w[p + "f_b_proj.weight"]) + w[p + "dt_bias"]
    A = w[p + "A_log"].reshape(-1)[:H].exp().repeat_interleave(d)
    if cfg.lower_bound is not None:
        g = cfg.lower_bound * torch.sigmoid(A * graw)
    else:
        g = -A * F.softplus(graw, threshold=20.0)
    g = heads(g)
    beta = torch.sigmoid(linear(x, w[p + "b_proj.weight"])).transpose(1, 2)
    o, _ = kda_chunked(q, k, v, g, beta, chunk=chunk, min_log_decay=cfg.lower_bound)
    o = rms_norm(o.transpose(1, 2), w[p + "o_norm.weight"], cfg.eps)  # [B, T, H, d]
    if cfg.full_rank_gate:
        gate = linear(x, w[p + "g_proj.weight"])
    else:
        gate = linear(linear(x, w[p + "g_a_proj.weight"]), w[p + "g_b_proj.weight"])
    o = o.reshape(B, T, H * d) * torch.sigmoid(gate)
    return linear(o, w[p + "o_proj.weight"])


# --- MLA -------------------------------------------------------------------------


def mla_layer(cfg, w, p, x):
    B, T, _ = x.shape
    n, P, R, Vd, C = cfg.heads, cfg.nope, cfg.rope, cfg.v_dim, cfg.kv_lora
    if cfg.q_lora:
        q = linear(rms_norm(linear(x, w[p + "q_a_proj.weight"]), w[p + "q_a_layernorm.weight"], 1e-6),
                   w[p + "q_b_proj.weight"])
    else:
        q = linear(x, w[p + "q_proj.weight"])
    q = q.reshape(B, T, n, P + R).transpose(1, 2)
    ckr = linear(x, w[p + "kv_a_proj_with_mqa.weight"])
    c = rms_norm(ckr[..., :C], w[p + "kv_a_layernorm.weight"], 1e-6)
    kr = ckr[..., C:]
    kv = linear(c, w[p + "kv_b_proj.weight"]).reshape(B, T, n, P + Vd).transpose(1, 2)
    key = torch.cat([kv[..., :P], kr.unsqueeze(1).expand(B, n, T, R)], dim=-1)
    value = kv[..., P:]
    scores = (q @ key.transpose(-1, -2)) * (P + R) ** -0.5
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    o = (torch.softmax(scores, dim=-1) @ value).transpose(1, 2).reshape(B, T, n * Vd)
    if cfg.mla_gate:
        o = o * torch.sigmoid(linear(x, w[p + "g_proj.weight"]))
    return linear(o, w[p + "o_proj.weight"])


# --- FFN -------------------------------------------------------------------------


def dense_ffn(cfg, w, p, x):
    return linear(activation(cfg, linear(x, w[p + "gate_proj.weight"]), linear(x, w[p + "up_proj.weight"])),
                  w[p + "down_proj.weight"])


def route(cfg, w, p, x):
    """Sigmoid scores, top-k by score + correction bias, weights renormalised and scaled."""
    s = torch.sigmoid(linear(x, w[p + "gate.weight"]))
    bias = w[p + "gate.e_score_correction_bias"].to(s.dtype)
    sel = torch.topk((s + bias).detach(), cfg.top_k, dim=-1).indices
    ws = torch.gather(s, -1, sel)
    return sel, ws / ws.sum(-1, keepdim=True) * cfg.scaling


def moe_ffn(cfg, w, p, x, load=None):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    sel, weights = route(cfg, w, p, x)
    z = linear(x, w[p + "routed_expert_down_proj.weight"]) if cfg.latent else x
    y = torch.zeros_like(z)
    for e in range(cfg.experts):
        rows, slot = (sel == e).nonzero(as_tuple=True)
        if load is not None:
            load[e] += rows.numel()
        if rows.numel() == 0:
            continue
        e_p = f"{p}experts.{e}."
        ze = z[rows]
        h = linear(activation(cfg, linear(ze, w[e_p + "w1.weight"]), linear(ze, w[e_p + "w3.weight"])),
                   w[e_p + "w2.weight"])
        y = y.index_add(0, rows, h * weights[rows, slot].unsqueeze(-1))
    if cfg.latent:
        if cfg.latent_norm:
            y = rms_norm(y, w[p + "routed_expert_norm.weight"], cfg.eps)
        y = linear(y, w[p + "routed_expert_up_proj.weight"])
    if cfg.shared:
        y = y + dense_ffn(cfg, w, p + "shared_experts.", x)
    return y.reshape(shape)


def ffn(cfg, w, i, x, loads=None):
    if cfg.is_moe(i):
        return moe_ffn(cfg, w, f"{cfg.prefix}layers.{i}.block_sparse_moe.", x,
                       None if loads is None else loads[i])
    return dense_ffn(cfg, w, f"{cfg.prefix}layers.{i}.mlp.", x)


def mixer(cfg, w, i, x, chunk):
    p = f"{cfg.prefix}layers.{i}.self_attn."
    return kda_layer(cfg, w, p, x, chunk) if cfg.is_kda(i) else mla_layer(cfg, w, p, x)


# --- the stacks ------------------------------------------------------------------


def attn_res_mix(cfg, bank, prefix, norm_w, proj_w):
    """Softmax over the candidates bank + [prefix], scored against norm_w * proj_w."""
    cands = torch.stack(bank + [prefix], dim=0)  # [K, B, T, D]
    qv = norm_w * proj_w.reshape(-1)
    scores = (rms_norm(cands, None, cfg.eps) * qv).sum(-1)  # [K, B, T]
    return (torch.softmax(scores, dim=0).unsqueeze(-1) * cands).sum(0)


def forward(cfg, w, tokens, dtype=torch.float32, chunk=16, loads=None):
    """logits [B, T, vocab] of tokens [B, T]; w maps checkpoint names to tensors."""
    w = {name: t.to(dtype) for name, t in w.items()} if dtype is not None else w
    P = cfg.prefix
    h = w[P + "embed_tokens.weight"][tokens]
    if not cfg.k3:
        for i in range(cfg.layers):
            lp = f"{P}layers.{i}."
            h = h + mixer(cfg, w, i, rms_norm(h, w[lp + "input_layernorm.weight"], cfg.eps), chunk)
            h = h + ffn(cfg, w, i, rms_norm(h, w[lp + "post_attention_layernorm.weight"], cfg.eps), loads)
        return linear(rms_norm(h, w[P + "norm.weight"], cfg.eps), w[cfg.head_name])
    bank, prefix = [], h
    for i in range(cfg.layers):
        lp = f"{P}layers.{i}."
        x = attn_res_mix(cfg, bank, prefix, w[lp + "self_attention_res_norm.weight"],
                         w[lp + "self_attention_res_proj.weight"])
        a = mixer(cfg, w, i, rms_norm(x, w[lp + "input_layernorm.weight"], cfg.eps), chunk)
        if i % cfg.block == 0:
            bank = bank + [prefix]
            prefix = a
        else:
            prefix = prefix + a
        x = attn_res_mix(cfg, bank, prefix, w[lp + "mlp_res_norm.weight"], w[lp + "mlp_res_proj.weight"])
        prefix = prefix + ffn(cfg, w, i, rms_norm(x, w[lp + "post_attention_layernorm.weight"], cfg.eps),
                              loads)
    x = attn_res_mix(cfg, bank, prefix, w[P + "output_attn_res_norm.weight"], w[P + "output_attn_res_proj.weight"])
    return linear(rms_norm(x, w[P + "norm.weight"], cfg.eps), w[cfg.head_name])


def relative_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def log_softmax_nll(logits, tokens):
    """Mean negative log-likelihood of tokens[1:] given the logits at [:-1]."""
    lp = torch.log_softmax(logits[..., :-1, :].double(), dim=-1)
    return -lp.gather(-1, tokens[..., 1:].unsqueeze(-1)).mean().item()


def perplexity(logits, tokens):
    return math.exp(log_softmax_nll(logits, tokens))
