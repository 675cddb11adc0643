"""Claim: releasing the DDP-wrapped model before `destroy_process_group()` removes gloo's
teardown abort ("terminate called without an active exception", exit 134 after the last step).

Launches examples/trainers/train_ddp.py as the local site does (two plain processes, env://
rendezvous, 6 steps, a checkpoint every 3), `--launches` times as written (the baseline), then
as many times with two lines added before its `dist.destroy_process_group()`:
`del model, optimizer` and `gc.collect()` (what `campaign.train.dist.teardown` does for the
built-in trainer). Both variants alternate, so machine load hits them alike. Prints the aborts
of each and, last, the ratio of the released variant's abort rate to the baseline's.

    python benchmarks/teardown_abort.py                    # 2 x 60 launches: about 6 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "trainers" / "train_ddp.py"
DESTROY = "dist.destroy_process_group()\n"
RELEASE = "del model, optimizer\nimport gc\ngc.collect()\n"
ABORT = "terminate called without an active exception"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: Path, out: Path) -> bool:
    """One two-rank run; True when a rank aborted in teardown."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
        log = open(out / f"rank-{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(script), "--max_iters", "6", "--ckpt_interval", "3",
                                        "--out_dir", str(out / "ck"), "--batch_size", "256"],
                                       env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    for p, log in procs:
        p.wait(timeout=120)
        log.close()
    return any(ABORT in (out / f"rank-{r}.log").read_text() for r in (0, 1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=60, help="launches per variant")
    args = p.parse_args(argv)
    text = SCRIPT.read_text()
    assert text.count(DESTROY) == 1, f"{SCRIPT}: expected one {DESTROY.strip()}"
    with tempfile.TemporaryDirectory(prefix="teardown-abort-") as d:
        tmp = Path(d)
        released = tmp / "train_ddp_released.py"
        released.write_text(text.replace(DESTROY, RELEASE + DESTROY))
        variants = {"as written": SCRIPT, "released": released}
        aborts = dict.fromkeys(variants, 0)
        for i in range(args.launches):
            for name, script in variants.items():
                out = tmp / f"{name.replace(' ', '-')}-{i}"
                out.mkdir()
                aborts[name] += launch(script, out)
            print(f"# {i + 1}/{args.launches}: " + ", ".join(f"{k} {v}" for k, v in aborts.items()),
                  file=sys.stderr, flush=True)
    import torch

    print(f"# torch={torch.__version__} launches per variant={args.launches}")
    print(f"{'variant':<12}{'aborts':>8}{'rate':>8}")
    for name, n in aborts.items():
        print(f"{name:<12}{n:>8}{n / args.launches:>8.3f}")
    base = aborts["as written"]
    ratio = f"{aborts['released'] / base:.3f}" if base else "n/a (no abort in the baseline)"
    print(f"released/as written abort rate: {ratio}")
    targets = Targets("teardown_abort")
    targets.check("aborts of the released variant", aborts["released"], "==", 0)
    targets.exit()


if __name__ == "__main__":
    main()
