#!/usr/bin/env python3
"""PyTorch peer benchmark for quiver's GPU training (PERF.md "Training").

Builds the same decoder as quiver (src/model/model.h) from a quiver config JSON and times
training steps on random token ids: AdamW (fused, lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on
2-D weights only, the embeddings included), BF16 autocast with FP32 master weights, gradient
clipping 1.0, F.scaled_dot_product_attention(is_causal=True) on the FlashAttention backend.

  python3 bench/peer_train.py --config configs/rel10m-mha.json --micro-batch 64 --seq-len 1024 \
      [--steps 30] [--warmup 10] [--compile] [--out DIR]
  python3 bench/peer_train.py --all [--out DIR]      # writes DIR/peer-train-DATE.{json,md}
  python3 bench/peer_train.py --count-only --config configs/alg110m-dense.json   # no torch needed

Supported: attention-only patterns ("AAAA...") with ffn.law == "dense". Everything else is
refused with a message.

MFU = (6·N_params + attention FLOPs per token) · tokens/s / 790e12 (H200 dense BF16 peak used
by PERF.md). N_params counts every parameter once (tied head: the embedding once), as quiver does.
Attention FLOPs per token, per attention layer, forward + backward:
  QKᵀ: 2·T·D (one multiply-add per key position and model dim), PV: another 2·T·D  → 4·T·D;
  causal mask halves it → 2·T·D; backward is twice the forward → ×3 → 6·T·D.
  Total per token: 6 · n_attention_layers · T · D  (T = sequence length of the run).
"""
import argparse
import datetime
import gc
import json
import math
import os
import statistics
import sys
import time

PEAK_FLOPS = 790e12
ALG110M_DENSE_PARAMS = 110_631_168

# The --all matrix (the three configurations): (config relative to the repo, micro, T).
ALL_RUNS = [
    ("configs/rel10m-mha.json", 64, 1024),
    ("configs/rel100m-mha.json", 4, 4096),
    ("configs/alg110m-dense.json", 40, 1536),
]
ALL_WARMUP = 8
ALL_STEPS = 20

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, flush=True)


def die(msg, code=2):
    print("peer_train: error: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


# ----------------------------------------------------------------------------------------------
# Config (pure Python; defaults as in src/model/config.h)

DEFAULTS = {
    "name": "", "vocab_size": 0, "context": 0, "d_model": 0, "n_heads": 0, "n_kv_heads": 0,
    "n_layers": 0, "pattern": "", "norm": "rmsnorm", "norm_eps": 1e-5, "positions": "rope",
    "rope_base": 10000.0, "attn_bias": False, "tied_head": True, "init_std": 0.02, "seed": 42,
}
FFN_DEFAULTS = {"kind": "swiglu", "width": 0, "law": "dense", "schedule": "cyclic",
                "d_groups": [], "f_groups": [], "bias": False}
RELATION_DEFAULTS = {"tau_s": 2.0, "lambda_init": 0.5, "lambda_frozen": False, "givens": True,
                     "exchange_only": False, "raw_x": False}


def resolve_config_path(path):
    if os.path.exists(path):
        return path
    for cand in (os.path.join(REPO_ROOT, path), os.path.join(REPO_ROOT, "configs", path + ".json"),
                 os.path.join(REPO_ROOT, "configs", path)):
        if os.path.exists(cand):
            return cand
    die("config not found: %s" % path)


def load_config(path):
    path = resolve_config_path(path)
    with open(path) as f:
        j = json.load(f)
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in j.items() if k not in ("ffn", "relation")})
    cfg["ffn"] = dict(FFN_DEFAULTS, **j.get("ffn", {}))
    cfg["relation"] = dict(RELATION_DEFAULTS, **j.get("relation", {}))
    if not cfg["name"]:
        cfg["name"] = os.path.splitext(os.path.basename(path))[0]
    # Basic validation (as quiver's validate()).
    for k in ("vocab_size", "context", "d_model", "n_heads", "n_layers"):
        if int(cfg[k]) <= 0:
            die("config %s: field %r must be positive, got %r" % (path, k, cfg[k]))
    if cfg["d_model"] % cfg["n_heads"]:
        die("config %s: d_model %d not divisible by n_heads %d" % (path, cfg["d_model"], cfg["n_heads"]))
    if cfg["n_heads"] % kv_heads(cfg):
        die("config %s: n_heads %d not a multiple of n_kv_heads %d" % (path, cfg["n_heads"], kv_heads(cfg)))
    if len(cfg["pattern"]) != cfg["n_layers"]:
        die("config %s: pattern %r has %d characters, n_layers = %d"
            % (path, cfg["pattern"], len(cfg["pattern"]), cfg["n_layers"]))
    if cfg["norm"] not in ("rmsnorm", "layernorm"):
        die("config %s: norm must be rmsnorm or layernorm, got %r" % (path, cfg["norm"]))
    if cfg["positions"] not in ("rope", "learned"):
        die("config %s: positions must be rope or learned, got %r" % (path, cfg["positions"]))
    if cfg["positions"] == "rope" and head_dim(cfg) % 2:
        die("config %s: RoPE needs an even head width, got %d" % (path, head_dim(cfg)))
    if cfg["ffn"]["kind"] not in ("swiglu", "gelu"):
        die("config %s: ffn.kind must be swiglu or gelu, got %r" % (path, cfg["ffn"]["kind"]))
    return cfg


def head_dim(cfg):
    return cfg["d_model"] // cfg["n_heads"]


def kv_heads(cfg):
    return cfg["n_kv_heads"] if cfg.get("n_kv_heads", 0) > 0 else cfg["n_heads"]


def check_supported(cfg):
    """The peer implements attention-only, dense-FFN models; anything else is an error."""
    bad = sorted(set(c for c in cfg["pattern"] if c != "A"))
    if bad:
        die("config %r: pattern %r has non-attention mixers %s; the PyTorch peer supports only "
            "attention-only patterns (\"AAAA...\")" % (cfg["name"], cfg["pattern"], bad))
    if cfg["ffn"]["law"] != "dense":
        die("config %r: ffn.law = %r; the PyTorch peer supports only ffn.law == \"dense\""
            % (cfg["name"], cfg["ffn"]["law"]))


def count_params(cfg):
    """Pure-Python mirror of quiver's param_table() (src/model/model.cpp), every mixer kind."""
    V, D, H, Dh = cfg["vocab_size"], cfg["d_model"], cfg["n_heads"], head_dim(cfg)
    F, kv = cfg["ffn"]["width"], kv_heads(cfg) * head_dim(cfg)
    ln = cfg["norm"] == "layernorm"
    rel = cfg["relation"]
    norm = D * (2 if ln else 1)
    n = V * D
    if cfg["positions"] == "learned":
        n += cfg["context"] * D
    for kind in cfg["pattern"]:
        n += norm
        if kind == "A":
            n += D * D + 2 * D * kv + D * D
            if cfg["attn_bias"]:
                n += D + 2 * kv + D
        else:
            wi = not rel["raw_x"]
            n += D * D * (3 + (1 if wi else 0))
            if cfg["attn_bias"]:
                n += D * (3 + (1 if wi else 0))
            if rel["givens"] and H > 1:
                n += H // 2
            if kind == "F":
                n += 1
            else:
                n += D * Dh + Dh * H * Dh + H + H * Dh
        n += norm
        if cfg["ffn"]["kind"] == "swiglu":
            n += D * F
        n += D * F + F * D
        if cfg["ffn"]["bias"]:
            n += (F if cfg["ffn"]["kind"] == "swiglu" else 0) + F + D
    n += norm
    if not cfg["tied_head"]:
        n += D * V
    return n


def attn_flops_per_token(cfg, T):
    # 6 · n_attention_layers · T · D (see the module docstring for the derivation).
    n_attn = sum(1 for c in cfg["pattern"] if c == "A")
    return 6 * n_attn * T * cfg["d_model"]


def flops_per_token(cfg, n_params, T):
    return 6 * n_params + attn_flops_per_token(cfg, T)


def check_param_count(cfg, n):
    if cfg["name"] == "alg110m-dense":
        assert n == ALG110M_DENSE_PARAMS, \
            "alg110m-dense must have exactly %d parameters, got %d" % (ALG110M_DENSE_PARAMS, n)


# ----------------------------------------------------------------------------------------------
# Model (torch; imported lazily so that --count-only works without it)

def build_model_class():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Norm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            D = cfg["d_model"]
            self.layernorm = cfg["norm"] == "layernorm"
            self.eps = float(cfg["norm_eps"])
            self.weight = nn.Parameter(torch.ones(D))
            self.bias = nn.Parameter(torch.zeros(D)) if self.layernorm else None

        def forward(self, x):
            if self.layernorm:
                return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    class Attention(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            D, H, Hkv, Dh = cfg["d_model"], cfg["n_heads"], kv_heads(cfg), head_dim(cfg)
            b = bool(cfg["attn_bias"])
            self.H, self.Hkv, self.Dh = H, Hkv, Dh
            self.rope = cfg["positions"] == "rope"
            self.wq = nn.Linear(D, H * Dh, bias=b)
            self.wk = nn.Linear(D, Hkv * Dh, bias=b)
            self.wv = nn.Linear(D, Hkv * Dh, bias=b)
            self.wo = nn.Linear(D, D, bias=b)

        def forward(self, h, cos, sin):
            B, T, _ = h.shape
            q = self.wq(h).view(B, T, self.H, self.Dh).transpose(1, 2)     # [B, H, T, Dh]
            k = self.wk(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)   # [B, Hkv, T, Dh]
            v = self.wv(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)
            if self.rope:
                # rotate_half convention (quiver ops/rope.h): pairs (i, i + Dh/2), angle p·base^(-2i/Dh).
                dt = q.dtype
                q = (q.float() * cos + rotate_half(q.float()) * sin).to(dt)
                k = (k.float() * cos + rotate_half(k.float()) * sin).to(dt)
            if self.Hkv != self.H:
                # Query head h reads kv head h // (H / Hkv): repeat_interleave along the head axis.
                r = self.H // self.Hkv
                k = k.repeat_interleave(r, dim=1)
                v = v.repeat_interleave(r, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.Dh))
            y = y.transpose(1, 2).reshape(B, T, self.H * self.Dh)
            return self.wo(y)

    class FFN(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            D, Fw, b = cfg["d_model"], cfg["ffn"]["width"], bool(cfg["ffn"]["bias"])
            self.swiglu = cfg["ffn"]["kind"] == "swiglu"
            self.gate = nn.Linear(D, Fw, bias=b) if self.swiglu else None
            self.up = nn.Linear(D, Fw, bias=b)
            self.down = nn.Linear(Fw, D, bias=b)

        def forward(self, x):
            if self.swiglu:
                a = F.silu(self.gate(x)) * self.up(x)
            else:
                a = F.gelu(self.up(x), approximate="tanh")   # quiver's GELU is the tanh form
            return self.down(a)

    class Block(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.norm1 = Norm(cfg)
            self.mixer = Attention(cfg)
            self.norm2 = Norm(cfg)
            self.ffn = FFN(cfg)

        def forward(self, x, cos, sin):
            x = x + self.mixer(self.norm1(x), cos, sin)
            x = x + self.ffn(self.norm2(x))
            return x

    class QuiverLM(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            check_supported(cfg)
            V, D, L = cfg["vocab_size"], cfg["d_model"], cfg["n_layers"]
            self.cfg = cfg
            self.tok_emb = nn.Embedding(V, D)
            self.pos_emb = nn.Embedding(cfg["context"], D) if cfg["positions"] == "learned" else None
            self.layers = nn.ModuleList([Block(cfg) for _ in range(L)])
            self.norm_f = Norm(cfg)
            self.head = None if cfg["tied_head"] else nn.Linear(D, V, bias=False)
            if cfg["positions"] == "rope":
                Dh = head_dim(cfg)
                inv = cfg["rope_base"] ** (-2.0 * torch.arange(Dh // 2, dtype=torch.float64) / Dh)
                ang = torch.arange(cfg["context"], dtype=torch.float64)[:, None] * inv[None, :]
                ang = torch.cat((ang, ang), dim=-1)                        # [context, Dh]
                self.register_buffer("cos", ang.cos().float(), persistent=False)
                self.register_buffer("sin", ang.sin().float(), persistent=False)
            else:
                self.cos = self.sin = None
            self._init(cfg)

        def _init(self, cfg):
            # quiver Model::init: matrices and embeddings N(0, std); wo and ffn.down N(0, std/sqrt(2L));
            # norm weights 1, biases 0.
            std = cfg["init_std"]
            g = torch.Generator().manual_seed(int(cfg["seed"]))
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if p.dim() == 2:
                        s = std / math.sqrt(2 * cfg["n_layers"]) if name.endswith(("mixer.wo.weight", "ffn.down.weight")) else std
                        p.copy_(torch.randn(p.shape, generator=g) * s)
                    elif name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm_f.weight":
                        p.fill_(1.0)
                    else:
                        p.zero_()

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.tok_emb(idx)
            cos = sin = None
            if self.pos_emb is not None:
                x = x + self.pos_emb.weight[:T]
            else:
                cos, sin = self.cos[:T], self.sin[:T]
            for layer in self.layers:
                x = layer(x, cos, sin)
            x = self.norm_f(x)
            w = self.tok_emb.weight if self.head is None else self.head.weight
            logits = F.linear(x, w)                                        # [B, T, V]
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    return QuiverLM


# ----------------------------------------------------------------------------------------------
# Benchmark

_FLASH_STATE = {}


def flash_usable(torch, n_heads, dh):
    """Probe forward+backward of SDPA restricted to the flash backend for this head width."""
    key = (n_heads, dh)
    if key in _FLASH_STATE:
        return _FLASH_STATE[key]
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
    ok = True
    try:
        q = torch.randn(2, n_heads, 256, dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn_like(q, requires_grad=True)
        v = torch.randn_like(q, requires_grad=True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        torch.cuda.synchronize()
    except RuntimeError as e:
        ok = False
        log("WARNING: FlashAttention backend unsupported for head width %d (%s); falling back to "
            "SDPA's default backend choice" % (dh, str(e).splitlines()[0] if str(e) else type(e).__name__))
    _FLASH_STATE[key] = ok
    return ok


def run_one(config_path, micro, T, steps, warmup, compile_model):
    import torch
    from torch.nn.attention import sdpa_kernel, SDPBackend
    import contextlib

    cfg = load_config(config_path)
    check_supported(cfg)
    if cfg["positions"] == "learned" and T > cfg["context"]:
        die("--seq-len %d exceeds the context %d of %s (learned positions)" % (T, cfg["context"], cfg["name"]))
    if cfg["positions"] == "rope" and T > cfg["context"]:
        # RoPE tables are built for `context` rows; extend the config's context for the peer.
        cfg["context"] = T
    n_expected = count_params(cfg)
    check_param_count(cfg, n_expected)

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if compile_model:
        torch._dynamo.reset()

    QuiverLM = build_model_class()
    model = QuiverLM(cfg).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == n_expected, "PyTorch model has %d parameters, quiver's table %d" % (n_params, n_expected)
    check_param_count(cfg, n_params)
    log("[%s] params %s (matches quiver's count), micro %d, T %d, %s"
        % (cfg["name"], format(n_params, ","), micro, T, "compiled" if compile_model else "eager"))

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)

    flash = flash_usable(torch, cfg["n_heads"], head_dim(cfg))
    attn_ctx = (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)) if flash else contextlib.nullcontext
    fwd = torch.compile(model) if compile_model else model
    V = cfg["vocab_size"]

    def step():
        data = torch.randint(0, V, (micro, T + 1), device="cuda")
        idx, tgt = data[:, :-1], data[:, 1:]
        with attn_ctx(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        with attn_ctx():
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times = []
    first_step_s = None
    warm_s = 0.0
    loss = None
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i == 0:
            first_step_s = dt
        if i < warmup:
            warm_s += dt
        else:
            times.append(dt)
    loss_v = float(loss.item())
    if not math.isfinite(loss_v):
        raise RuntimeError("non-finite loss %r" % loss_v)
    med = statistics.median(times)
    tok_s = micro * T / med
    fpt = flops_per_token(cfg, n_params, T)
    row = {
        "config": cfg["name"], "mode": "compiled" if compile_model else "eager",
        "micro_batch": micro, "seq_len": T, "params": n_params,
        "tok_s": round(tok_s, 1), "step_ms_median": round(med * 1e3, 3),
        "step_ms_min": round(min(times) * 1e3, 3), "step_ms_max": round(max(times) * 1e3, 3),
        "mfu": round(fpt * tok_s / PEAK_FLOPS, 4),
        "mfu_6n": round(6 * n_params * tok_s / PEAK_FLOPS, 4),
        "flops_per_token": fpt,
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
        "attn_backend": "flash" if flash else "sdpa-default (flash unsupported)",
        "warmup": warmup, "steps": steps,
        "first_step_s": round(first_step_s, 2),   # includes torch.compile time when compiled
        "warmup_s": round(warm_s, 2),
        "final_loss": round(loss_v, 4),
    }
    log("[%s %s] %.0f tok/s (median step %.2f ms), MFU %.1f%% (6N only %.1f%%), peak %.2f GiB, "
        "first step %.1f s, attention %s"
        % (row["config"], row["mode"], tok_s, med * 1e3, 100 * row["mfu"], 100 * row["mfu_6n"],
           row["peak_gib"], first_step_s, row["attn_backend"]))
    del fwd, model, opt, loss
    gc.collect()
    torch.cuda.empty_cache()
    return row


def write_results(out_dir, rows, meta):
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, "peer-train-%s" % meta["date"])
    with open(base + ".json", "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=2)
        f.write("\n")
    lines = ["# PyTorch peer training benchmark (%s)" % meta["date"], "",
             "- GPU: %s" % meta["gpu"], "- torch: %s (CUDA %s)" % (meta["torch"], meta["cuda"]),
             "- command: `%s`" % meta["command"],
             "- random token ids, AdamW fused (lr 3e-4, betas 0.9/0.95, wd 0.1 on 2-D weights), BF16 autocast "
             "with FP32 master weights, clip 1.0, SDPA is_causal",
             "- tok/s = micro·T / median step time over the timed steps (after warmup; compile time excluded, "
             "shown as the first step's time)",
             "- MFU = (6·N + 6·L·T·D) · tok/s / 790e12; MFU(6N) = 6·N · tok/s / 790e12", "",
             "| config | mode | micro × T | params | tok/s | MFU | MFU (6N) | peak GiB | attention | first step s (compile) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %s | %d × %d | | | | | | | | FAILED: %s |"
                         % (r["config"], r["mode"], r["micro_batch"], r["seq_len"], r["error"].replace("|", "/")))
            continue
        lines.append("| %s | %s | %d × %d | %s | %s | %.1f%% | %.1f%% | %.2f | %s | %.1f | steps %d+%d |"
                     % (r["config"], r["mode"], r["micro_batch"], r["seq_len"], format(r["params"], ","),
                        format(int(r["tok_s"]), ","), 100 * r["mfu"], 100 * r["mfu_6n"], r["peak_gib"],
                        r["attn_backend"], r["first_step_s"], r["warmup"], r["steps"]))
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    log("wrote %s.json and %s.md" % (base, base))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="quiver config JSON (or preset name)")
    ap.add_argument("--micro-batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 30; 20 with --all)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup steps (default 10; 8 with --all)")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model), default mode")
    ap.add_argument("--all", action="store_true", help="the three issue configurations, eager and compiled")
    ap.add_argument("--out", default=None, help="results folder (default bench/results with --all)")
    ap.add_argument("--count-only", action="store_true", help="print the parameter count (no torch needed)")
    args = ap.parse_args()

    if args.count_only:
        if not args.config:
            die("--count-only needs --config")
        cfg = load_config(args.config)
        n = count_params(cfg)
        check_param_count(cfg, n)
        log("%s: %d parameters" % (cfg["name"], n))
        return 0

    if not args.all and not args.config:
        die("give --config (with --micro-batch and --seq-len) or --all")

    try:
        import torch
    except ImportError:
        die("PyTorch is not installed", 1)
    if not torch.cuda.is_available():
        die("CUDA is not available (torch %s); this benchmark needs a GPU" % torch.__version__, 1)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)

    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": " ".join(["python3"] + sys.argv),
    }
    log("GPU %s, torch %s, CUDA %s" % (meta["gpu"], meta["torch"], meta["cuda"]))

    if args.all:
        steps = args.steps if args.steps is not None else ALL_STEPS
        warmup = args.warmup if args.warmup is not None else ALL_WARMUP
        runs = [(os.path.join(REPO_ROOT, c), m, t, comp) for c, m, t in ALL_RUNS for comp in (False, True)]
        out_dir = args.out or os.path.join(REPO_ROOT, "bench", "results")
    else:
        if args.micro_batch is None or args.seq_len is None:
            die("--config needs --micro-batch and --seq-len")
        steps = args.steps if args.steps is not None else 30
        warmup = args.warmup if args.warmup is not None else 10
        runs = [(args.config, args.micro_batch, args.seq_len, args.compile)]
        out_dir = args.out
    if steps < 1 or warmup < 1:
        die("--steps and --warmup must be ≥ 1")
    meta["warmup"], meta["steps"] = warmup, steps

    rows, failed = [], False
    t_all = time.perf_counter()
    for cfg_path, micro, T, comp in runs:
        try:
            rows.append(run_one(cfg_path, micro, T, steps, warmup, comp))
        except Exception as e:   # OOM, compile failures, assertion: record, go on
            failed = True
            msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            log("FAILED %s %s: %s" % (cfg_path, "compiled" if comp else "eager", msg))
            rows.append({"config": os.path.splitext(os.path.basename(cfg_path))[0],
                         "mode": "compiled" if comp else "eager", "micro_batch": micro, "seq_len": T,
                         "error": msg})
            gc.collect()
            torch.cuda.empty_cache()
            if isinstance(e, AssertionError) and not args.all:
                raise
    meta["total_s"] = round(time.perf_counter() - t_all, 1)
    log("total %.1f s" % meta["total_s"])
    if out_dir:
        write_results(out_dir, rows, meta)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
