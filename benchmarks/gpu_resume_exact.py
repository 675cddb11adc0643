"""Claim: on a GPU a run killed mid-step (SIGKILL or SIGTERM) and resumed from its checkpoint
gives the same losses as a run never interrupted, bit for bit.

Runs campaign `gpu-resume` (`--size`, default gpt2-124m, FSDP2, NCCL, `deterministic: true`)
through `campaign submit` on the `local` site: one `resume_test` stage on 1 GPU with a
checkpoint at step 10, the signal once step 12 is reported, a resume to step 16, and the
losses compared at tolerance 0 with an uninterrupted run. If they are not bit-exact, the test
runs again (campaign `gpu-resume-tol`) at --resume-tolerance (default: 2x the largest
difference seen, rounded up to one digit).

--strict instead runs the test with deterministic kernels forced: the same trainer under a
trainer command that calls `torch.use_deterministic_algorithms(True, warn_only=False)`
(campaign `gpu-resume-strict`), falling back to the math attention backend
(`gpu-resume-math-sdpa`) if some op has no deterministic variant; then, given
--resume-tolerance, the built-in trainer at that tolerance.

Baseline: two fresh runs of the same trainer inside the same test (the uninterrupted one and
the interrupted one before its cut): how far the kernels alone drift. Prints (and writes to
--out, default $OUT, as summary.md) per campaign and signal: the verdict, the step resumed
from, whether the first resumed step equals the interrupted run's own loss (the checkpoint
restored everything), the largest loss difference vs the uninterrupted run, the fresh-run
drift, and the ratio of the two.

    python benchmarks/gpu_resume_exact.py                          # 1 GPU of this machine
    python benchmarks/gpu_resume_exact.py --strict --resume-tolerance 0.3
    python benchmarks/gpu_resume_exact.py --rehearsal              # tiny model on CPU (gloo)
    python benchmarks/gpu_resume_exact.py --write-specs DIR        # only write gpu-resume.yaml

Needs the `campaign` package installed. Its section: docs/performance.md, "Multi-GPU (NCCL)" (the earlier figures are history there: no commit was recorded).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import _gpu_harness as h
from _gpu_harness import fmt

# The trainer contract allows any command. This one runs the built-in trainer with
# warn_only=False, so cuDNN and flash attention take their deterministic backward (or an op
# without one fails loudly).
STRICT_TRAINER = ("import runpy, torch; f = torch.use_deterministic_algorithms; "
                  "torch.use_deterministic_algorithms = lambda mode, **kw: f(mode, warn_only=False); "
                  "runpy.run_module('campaign.train', run_name='__main__', alter_sys=True)")
# Fallback when some op has no deterministic variant: only attention is made deterministic,
# by restricting scaled_dot_product_attention to its math backend.
MATH_SDPA_TRAINER = ("import runpy, torch; b = torch.backends.cuda; b.enable_cudnn_sdp(False); "
                     "b.enable_flash_sdp(False); b.enable_mem_efficient_sdp(False); b.enable_math_sdp(True); "
                     "runpy.run_module('campaign.train', run_name='__main__', alter_sys=True)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = h.parser(__doc__, size="gpt2-124m", micro_batch=8, budget_s=300.0, drill_names=True)
    p.add_argument("--strict", action="store_true",
                   help="deterministic kernels forced (own trainer command), then the built-in trainer at "
                        "--resume-tolerance if given")
    p.add_argument("--resume-tolerance", type=float, default=None,
                   help="tolerance of the follow-up test (default: 2x the largest difference seen, rounded up)")
    return h.finish_args(p.parse_args(argv))


def spec(args: argparse.Namespace, name: str, tolerance: float, command: str | None = None) -> dict[str, Any]:
    t = h.trainer(args, keep_last=3)
    if command:
        t["command"] = ["{python}", "-c", command, "--config", "{config}"]
    forced = ", deterministic kernels forced (own trainer command)" if command else ""
    return h.campaign_spec(args, name, f"resume test at tolerance {tolerance:g}, {args.size} model, FSDP2{forced}", t, [
        {"name": "resume-test", "kind": "resume_test", "nodes": 1, "checkpoint_step": 10, "interrupt_step": 12,
         "steps": 16, "signals": ["SIGKILL", "SIGTERM"], "tolerance": tolerance, "timeout_s": 300,
         "continue_on_failure": True}])


# --- reading results -----------------------------------------------------------------------------

def resume_report(status: dict[str, Any] | None) -> dict[str, Any] | None:
    st = next((x for x in (status or {}).get("stages", []) if x["name"] == "resume-test"), None)
    if st is None:
        return None
    checks = (status["stage_numbers"].get("resume-test") or {}).get("checks") or []
    diffs = [c.get("max_abs_diff") for c in checks if c.get("max_abs_diff") is not None]
    ran = bool(checks) and all(c.get("resume_exit_code") == 0 and c.get("resumed_from_step") is not None
                               for c in checks)
    return {"state": st["state"], "verdict": st["verdict"], "checks": checks,
            "max_abs_diff": max(diffs) if diffs else None, "comparisons_ran": ran}


def resume_pairs(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per signal, from the exported steps of a resume test: is the resumed run's first step
    the interrupted run's own step, bit for bit (the checkpoint restored model, optimizer,
    data position and RNG exactly, whatever the kernels), and how far two fresh runs (the
    reference and the interrupted one, before the cut) drift apart (the kernels' noise)."""
    by: dict[str, dict[int, float]] = {}
    for m in steps:
        if m.get("stage") == "resume-test" and m.get("loss") is not None:
            by.setdefault(m.get("label") or "", {})[int(m["step"])] = float(m["loss"])
    ref = by.get("reference", {})
    out = []
    for sig in ("SIGKILL", "SIGTERM"):
        cut = next((v for k, v in by.items() if k.startswith(f"{sig} at")), None)
        res = by.get(f"resume after {sig}")
        if not cut or not res:
            continue
        first = min(res)
        noise = [abs(cut[k] - ref[k]) for k in cut if k in ref]
        out.append({"signal": sig, "resumed_first_step": first, "resumed_loss": res[first],
                    "interrupted_loss_same_step": cut.get(first),
                    "first_step_exact": cut.get(first) == res[first],
                    "fresh_run_max_abs_diff": max(noise) if noise else None,
                    "fresh_run_first_diff_step": next((k for k in sorted(cut) if k in ref and cut[k] != ref[k]), None)})
    return out


def nice_ceil(x: float) -> float:
    """Round up to one significant digit: 3.2e-4 -> 4e-4."""
    e = 10 ** math.floor(math.log10(x))
    return math.ceil(x / e - 1e-9) * e


def test(run: h.Run, spec_: dict[str, Any], trainer_label: str) -> dict[str, Any]:
    res = run.campaign(spec_, reserve_s=20)
    out = {"trainer": trainer_label, "tolerance": spec_["stages"][0]["tolerance"],
           "result": resume_report(res["status"]), "resume_pairs": resume_pairs(res["steps"])}
    run.result[spec_["name"]].update(out)
    return out


# --- table -----------------------------------------------------------------------------------------

def ratio(diff: float | None, noise: float | None) -> str:
    if diff == 0:
        return "0 (exact)"
    if diff is None or noise is None:
        return "-"
    return f"{diff / noise:.2f}x" if noise else "inf (fresh runs identical)"


def resume_table(tests: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, t in tests.items():
        r = t["result"] or {}
        checks = {c.get("signal"): c for c in r.get("checks", [])}
        pairs = {p["signal"]: p for p in t["resume_pairs"]}
        for sig in sorted(set(checks) | set(pairs)) or ["-"]:
            c, p = checks.get(sig, {}), pairs.get(sig, {})
            exact = p.get("first_step_exact")
            rows.append([name, t["trainer"], fmt(t["tolerance"], "g"), sig, fmt(r.get("state")),
                         fmt(c.get("resumed_from_step")), "-" if exact is None else ("yes" if exact else "NO"),
                         fmt(c.get("max_abs_diff"), ".3g"), fmt(p.get("fresh_run_max_abs_diff"), ".3g"),
                         ratio(c.get("max_abs_diff"), p.get("fresh_run_max_abs_diff"))])
    return h.md_table(["campaign", "trainer", "tolerance", "signal", "result", "resumed from",
                       "1st resumed step = interrupted run's own", "largest loss diff vs uninterrupted",
                       "fresh-run drift (baseline)", "ratio"], rows)


# --- main ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    title = "Resume test" + (" (deterministic kernels forced)" if args.strict else "")
    run = h.start(args, title, [spec(args, "gpu-resume", 0.0)])
    tests: dict[str, dict[str, Any]] = {}
    if args.strict:
        for name, code in (("gpu-resume-strict", STRICT_TRAINER), ("gpu-resume-math-sdpa", MATH_SDPA_TRAINER)):
            tests[name] = test(run, spec(args, name, 0.0, code), "deterministic kernels forced")
            r = tests[name]["result"]
            if (r and r["comparisons_ran"]) or run.left() < 90:
                break  # it ran (exact or not): no fallback needed
            h.say(f"{name} did not run its comparisons (an op without a deterministic variant?); trying the next")
        tol = args.resume_tolerance
    else:
        tests["gpu-resume"] = test(run, spec(args, "gpu-resume", 0.0), "built-in")
        r = tests["gpu-resume"]["result"]
        exact = not r or r["state"] == "passed" or not r["comparisons_ran"] or not r["max_abs_diff"]
        tol = None if exact else args.resume_tolerance or nice_ceil(2 * r["max_abs_diff"])
    if tol and run.left() > 75:
        h.say(f"resume test again, built-in trainer, at tolerance {tol:g}")
        tests["gpu-resume-tol"] = test(run, spec(args, "gpu-resume-tol", tol), "built-in")
    lines: list[str] = []
    for name in tests:
        lines += h.stage_lines(run, name) + [""]
    lines += ["### Resume test", "", resume_table(tests), "",
              "Ratio vs baseline: the largest loss difference after the resume over the drift between two fresh "
              "runs in the same test (0: bit for bit)."]
    first = next(iter(tests))
    targets = h.Targets("gpu_resume_exact")
    code = run.result[first]["submit"]["exit_code"]
    targets.require(f"{first} passed (resumed losses equal the uninterrupted run's)", code == 0,
                    f"campaign submit exit {code}")
    h.finish(run, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
