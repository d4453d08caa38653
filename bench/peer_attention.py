"""Peer timing of causal attention: PyTorch SDPA forward and forward + backward in bf16 at the
shapes of quiver's GpuAttentionTiming test (tests/gpu/test_gpu_attention.cpp), so the two tables
can be compared line by line from one run on one GPU. The first three shapes are also the
FlashRelation scales of GpuRelationTiming (tests/gpu/test_gpu_relation.cpp): 10M, 30M and 100M.

SDPA takes [B, H, T, Dh]; the FlashAttention backend is forced where it accepts the shape, then
the memory-efficient backend, then the math backend; the backend that ran is printed. Times are
medians of timed trials with CUDA events after warm-up.

Usage: python3 bench/peer_attention.py [--trials 10]
"""

import argparse
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'shape (B, T, H, Dh)':<26} {'backend':>9} {'fwd ms':>10} {'fwd tok/s':>14} "
          f"{'fwd+bwd ms':>12} {'fwd+bwd tok/s':>14}")
    for B, T, H, Dh in SHAPES:
        name, fwd, both = time_shape(B, T, H, Dh, args.trials)
        tokens = B * T
        print(f"({B:3d}, {T:4d}, {H:2d}, {Dh:3d})        {name:>9} {fwd:10.3f} "
              f"{tokens / (fwd * 1e-3):14.3e} {both:12.3f} {tokens / (both * 1e-3):14.3e}")


if __name__ == "__main__":
    main()
