"""Peer timing of causal attention: PyTorch SDPA forward and forward + backward in bf16 at the
shapes of quiver's GpuAttentionTiming test (tests/gpu/test_gpu_attention.cpp), so the two tables
can be compared line by line from one run on one GPU. The first three shapes are also the
FlashRelation scales of GpuRelationTiming (tests/gpu/test_gpu_relation.cpp): 10M, 30M and 100M.

SDPA takes [B, H, T, Dh]; the FlashAttention backend is forced where it accepts the shape, then
the memory-efficient backend, then the math backend; the backend that ran is printed. Times are
medians of timed trials with CUDA events after warm-up.

--relation adds the materialized Relation of SPEC 2.1 (PyTorch autograd over the full [T, T]
flow per head: U = p1 p2^T / sqrt(Dh) by a bf16 matmul, then in fp32 S_p = sigmoid(U_pp / 2),
E = SiLU(U), R = E - lambda log(p+1) below the diagonal, S_p on it, softmax, and F Ĩ by a bf16
matmul; gradients for p1, p2, Ĩ and lambda) at the three FlashRelation scales: the peer of
issue 7's "at least 10x the materialized reference", in the same run as SDPA. Before timing it
checks its materialized flow against the factorized form (A_p, g_p, the strict-history softmax)
in float64 on a small shape.

--shapes B:T:H:Dh,... times those shapes instead (the materialized Relation too, with
--relation); --json PATH also writes the rows as JSON, which `quiver bench relation --device
cuda` reads to put SDPA and the materialized Relation beside FlashRelation in its table.

Usage: python3 bench/peer_attention.py [--trials 10] [--relation] [--shapes B:T:H:Dh,...]
                                       [--json PATH]
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(64, 1024, 8, 48), (32, 2048, 8, 64), (8, 4096, 8, 80), (40, 1536, 32, 24)]
BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("math", SDPBackend.MATH),
]


def median_ms(fn, trials):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def time_shape(B, T, H, Dh, trials):
    q, k, v = (
        torch.empty(B, H, T, Dh, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1).requires_grad_()
        for _ in range(3)
    )
    dy = torch.empty(B, H, T, Dh, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.backward(y, dy)
        q.grad = k.grad = v.grad = None

    for name, backend in BACKENDS:
        try:
            with sdpa_kernel(backend):
                forward_backward()
                torch.cuda.synchronize()
                fwd = median_ms(forward, trials)
                both = median_ms(forward_backward, trials)
            return name, fwd, both
        except RuntimeError:
            continue
    raise RuntimeError(f"no SDPA backend ran shape {(B, T, H, Dh)}")


def relation_materialized(p1, p2, v, lam):
    """Y of SPEC 2.1 with the whole flow F materialized; p1, p2, v [B, H, T, Dh]."""
    T, Dh = p1.shape[-2], p1.shape[-1]
    u = torch.matmul(p1, p2.transpose(-1, -2)).float() / Dh**0.5
    pos = torch.arange(T, device=p1.device)
    hist = pos[None, :] < pos[:, None]  # j < p
    diag = pos[None, :] == pos[:, None]
    self_gate = torch.sigmoid(torch.diagonal(u, dim1=-2, dim2=-1) / 2.0)
    bias = lam * torch.log(pos.to(torch.float32) + 1.0)[:, None]
    r = torch.where(hist, F.silu(u) - bias, torch.full_like(u, float("-inf")))
    r = torch.where(diag, self_gate[..., :, None].expand_as(u), r)
    flow = torch.softmax(r, dim=-1)
    return torch.matmul(flow.to(v.dtype), v)


def relation_factorized(p1, p2, v, lam):
    """The same Y by the exact factorization of SPEC 2.1 (A_p, g_p, Ī_p), for the check."""
    T, Dh = p1.shape[-2], p1.shape[-1]
    u = torch.matmul(p1, p2.transpose(-1, -2)) / Dh**0.5
    pos = torch.arange(T, device=p1.device)
    hist = pos[None, :] < pos[:, None]
    e = torch.where(hist, F.silu(u), torch.full_like(u, float("-inf")))
    s = torch.sigmoid(torch.diagonal(u, dim1=-2, dim2=-1) / 2.0)
    lse = torch.logsumexp(e, dim=-1)  # -inf at p = 0
    a = lse - lam * torch.log(pos.to(u.dtype) + 1.0)
    g = torch.where(pos > 0, torch.sigmoid(a - s), torch.zeros_like(a))
    w = torch.softmax(torch.where(hist, e, torch.full_like(e, -1e300)), dim=-1)
    w = torch.where(pos[:, None] > 0, w, torch.zeros_like(w))
    return (1 - g)[..., None] * v + g[..., None] * torch.matmul(w, v)


def check_relation():
    gen = torch.Generator(device="cuda").manual_seed(3)
    p1, p2, v = (torch.empty(2, 3, 77, 16, device="cuda", dtype=torch.float64).uniform_(-2, 2, generator=gen)
                 for _ in range(3))
    lam = torch.tensor(0.5, device="cuda", dtype=torch.float64)
    y, ref = relation_materialized(p1, p2, v, lam), relation_factorized(p1, p2, v, lam)
    err = ((y - ref).norm() / ref.norm()).item()
    if not err < 1e-5:  # the materialized softmax runs in fp32
        raise SystemExit(f"materialized Relation differs from the factorized form: rel. error {err:.3e}")
    return err


def time_relation(B, T, H, Dh, trials):
    p1, p2, v = (
        torch.empty(B, H, T, Dh, device="cuda", dtype=torch.bfloat16).uniform_(-2, 2).requires_grad_()
        for _ in range(3)
    )
    lam = torch.tensor(0.5, device="cuda", requires_grad=True)
    dy = torch.empty(B, H, T, Dh, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)

    def forward():
        with torch.no_grad():
            relation_materialized(p1, p2, v, lam)

    def forward_backward():
        y = relation_materialized(p1, p2, v, lam)
        torch.autograd.backward(y, dy)
        p1.grad = p2.grad = v.grad = lam.grad = None

    return median_ms(forward, trials), median_ms(forward_backward, trials)


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--shapes: '{item}' is not B:T:H:Dh with positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--relation", action="store_true",
                        help="also time the materialized Relation (SPEC 2.1): at the three Relation scales, "
                             "or at every --shapes shape")
    parser.add_argument("--shapes", help="B:T:H:Dh,... instead of the built-in shapes")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    relation_shapes = shapes if args.shapes else SHAPES[:3]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'shape (B, T, H, Dh)':<26} {'backend':>9} {'fwd ms':>10} {'fwd tok/s':>14} "
          f"{'fwd+bwd ms':>12} {'fwd+bwd tok/s':>14}")
    rows = []
    for B, T, H, Dh in shapes:
        name, fwd, both = time_shape(B, T, H, Dh, args.trials)
        tokens = B * T
        print(f"({B:3d}, {T:4d}, {H:2d}, {Dh:3d})        {name:>9} {fwd:10.3f} "
              f"{tokens / (fwd * 1e-3):14.3e} {both:12.3f} {tokens / (both * 1e-3):14.3e}")
        rows.append({"B": B, "T": T, "H": H, "Dh": Dh, "sdpa_backend": name, "sdpa_forward_ms": fwd,
                     "sdpa_total_ms": both})
    check = None
    if args.relation:
        check = check_relation()
        print(f"materialized Relation against its factorized form (float64): rel. error {check:.2e}")
        for B, T, H, Dh in relation_shapes:
            fwd, both = time_relation(B, T, H, Dh, args.trials)
            tokens = B * T
            print(f"({B:3d}, {T:4d}, {H:2d}, {Dh:3d})     relation {fwd:10.3f} "
                  f"{tokens / (fwd * 1e-3):14.3e} {both:12.3f} {tokens / (both * 1e-3):14.3e}")
            for row in rows:
                if (row["B"], row["T"], row["H"], row["Dh"]) == (B, T, H, Dh):
                    row["materialized_forward_ms"] = fwd
                    row["materialized_total_ms"] = both
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "trials": args.trials,
                       "materialized_check": check, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
