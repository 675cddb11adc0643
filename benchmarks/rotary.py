"""Claim: the rotary's Triton kernels take less GPU time than Inductor's code for the same math.

    python benchmarks/rotary.py                  # gpt2-124m and 1b shapes, bf16, one CUDA device
    python benchmarks/rotary.py --shape 1b --reps 200

What is timed, per shape, on the QKV projection's output (B, T, 3, H, D) in bf16:

- **baseline**: `torch.compile` of the PyTorch path (`rotary.apply_rotary` on q and k, v a
  view), the code the model ran before the kernels; its backward as Inductor generates it
  (the rotation's gradient and the concatenation of dq, dk, dv into the gradient of qkv);
- **kernels**: `rotary_triton.RotaryQKV` (one forward pass over q and k; one backward pass
  writing dq, dk, dv into the gradient of qkv).

Forward alone, and forward plus backward (upstream gradients in the (B, H, T, D) storage
SDPA's backward hands over), each the median of `--reps` timed runs by CUDA events after
warm-up. Also printed: the bytes each must move at the least (forward: read q and k, write
them; backward: read dq, dk, dv, write dqkv) over the time, against the device's copy rate
measured in the same run. The ratio is baseline time / kernel time (above 1: the kernels win).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from campaign.train import rotary  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets, skip  # noqa: E402

SHAPES = {"gpt2-124m": (12, 1024, 12, 64), "1b": (16, 2048, 16, 128)}  # (B, T, H, D)


def _time(fn, reps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(kernel ms, wall ms) per call: the device time of the kernels it launched (from the
    profiler, so the host's launch overhead is left out) and the wall time by CUDA events."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        walls.append(a.elapsed_time(b))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = sum(e.self_device_time_total for e in prof.key_averages()
                  if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
    return kernels / 1000 / reps, statistics.median(walls)


def _copy_rate(reps: int) -> float:
    """Bytes read plus written per second of a device-to-device copy of 2 GiB."""
    x = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms, _ = _time(lambda: y.copy_(x), reps)
    return 2 * x.numel() * 2 / (ms / 1e3)


def _baseline(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v = qkv.unbind(2)
    return rotary.apply_rotary(q, cos, sin), rotary.apply_rotary(k, cos, sin), v


def measure(shape: str, reps: int) -> dict[str, float]:
    from campaign.train import rotary_triton

    B, T, H, D = SHAPES[shape]
    cos, sin = (t.cuda() for t in rotary.rotary_tables(T, D))
    qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grads = [torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
    torch._dynamo.reset()  # each shape compiled afresh and static (a second shape would recompile dynamic)
    compiled = torch.compile(_baseline, dynamic=False)
    sides = {"baseline": lambda: compiled(qkv, cos, sin), "kernels": lambda: rotary_triton.RotaryQKV.apply(qkv, cos, sin)}
    out: dict[str, float] = {}
    for name, fwd in sides.items():
        with torch.no_grad():
            out[f"{name}_fwd"], out[f"{name}_fwd_wall"] = _time(fwd, reps)

        def step(fwd=fwd) -> None:  # type: ignore[no-untyped-def]
            qkv.grad = None
            torch.autograd.backward(fwd(), grads)
        out[f"{name}_step"], out[f"{name}_step_wall"] = _time(step, reps)
    qk = 2 * B * T * H * D * 2  # bytes of q and k in bf16
    out["fwd_bytes"], out["bwd_bytes"] = 2 * qk, 3 * qk  # fwd: read and write q, k; bwd: read dq, dk, dv, write dqkv
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeatable (default: both)")
    p.add_argument("--reps", type=int, default=100, help="timed runs per figure")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not rotary.load_kernels():
        skip("rotary", "needs a CUDA device and Triton (the kernels run on CUDA only; tests/train/test_rotary.py "
                       "checks them on CPU in Triton's interpreter)")
    targets = Targets("rotary")
    rate = _copy_rate(args.reps)
    print(f"# {torch.cuda.get_device_name()} torch={torch.__version__} copy rate {rate / 1e12:.2f} TB/s (read + write)")
    print("kernel time per call (profiler; wall by CUDA events, launch overhead included, in brackets)")
    print(f"{'shape':10} {'side':9} {'fwd ms':>8} {'fwd TB/s':>9} {'fwd+bwd ms':>11} {'bwd TB/s':>9} {'[fwd, fwd+bwd wall ms]':>24}")
    for shape in args.shape or list(SHAPES):
        m = measure(shape, args.reps)
        for side in ("baseline", "kernels"):
            fwd, step = m[f"{side}_fwd"], m[f"{side}_step"]
            bwd = max(step - fwd, 1e-9)
            print(f"{shape:10} {side:9} {fwd:8.3f} {m['fwd_bytes'] / fwd / 1e9:9.2f} {step:11.3f} "
                  f"{m['bwd_bytes'] / bwd / 1e9:9.2f} {m[side + '_fwd_wall']:11.3f} {m[side + '_step_wall']:11.3f}")
        print(f"ratio baseline/kernels at {shape} (kernel time): forward {m['baseline_fwd'] / m['kernels_fwd']:.2f}x, "
              f"forward+backward {m['baseline_step'] / m['kernels_step']:.2f}x (one layer; a step has n_layer)")
        targets.check(f"{shape} forward, baseline/kernels time", m["baseline_fwd"] / m["kernels_fwd"], ">", 1.0, "x")
        targets.check(f"{shape} forward+backward, baseline/kernels time", m["baseline_step"] / m["kernels_step"],
                      ">", 1.0, "x")
    targets.exit()


if __name__ == "__main__":
    sys.exit(main())
