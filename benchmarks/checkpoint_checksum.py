"""Claim: checksumming a checkpoint (a CRC-32 per file in meta.json at save, checked before a
load; issue 30, item 4) costs a small fraction of the save itself.

Saves a state dict of `--mb` MiB of float32 tensors (model-like: 1024 x 1024 blocks) with
torch.distributed.checkpoint (`dcp.save`, one process, files fsynced as the trainer's are),
`--repeat` times, and times: the save; `report.complete_checkpoint` (meta.json with sizes
and checksums, then `.complete`; here it checksums every file: in the built-in trainer each
rank checksums its own shards in its writer, in parallel, so this is one rank's whole share);
`report.check_checkpoint_files` (what a resume adds before its load). Files are in the page cache right after the save, as they
are for rank 0 on a node-local or cached filesystem; on Lustre the check reads them back from
the object servers (count ~1.4 GB/s per reader here, bounded by the filesystem there).

    python benchmarks/checkpoint_checksum.py            # 512 MiB, 3 repeats: ~1 min on 2 cores
    python benchmarks/checkpoint_checksum.py --mb 2048

Prints one row per repeat and the ratio (checksum + verify) / save, the baseline being the
save itself in the same repeat. Target: the median ratio <= 1.0, i.e. integrity at most
doubles a synchronous save's I/O time on one rank (measured 0.57 on 2 loaded cores at 512 MiB;
an asynchronous save checksums in its writer thread, off the training path, and each rank
checksums only its own shards).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import sys

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets  # noqa: E402

from campaign import report  # noqa: E402

RATIO_MAX = 1.0
"""(checksum at save + verify at load) / save, median over repeats."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512, help="MiB of tensors in the checkpoint")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    state = {"model": {f"w{i}": torch.randn(1024, 256) for i in range(args.mb)}}  # 1 MiB each
    print(f"torch {torch.__version__}; {args.mb} MiB state; {args.repeat} repeats")
    print(f"{'save_s':>8} {'checksum_s':>10} {'verify_s':>9} {'ratio':>7}")
    ratios = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            path = Path(d) / report.checkpoint_name(i + 1)
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
            t1 = time.perf_counter()
            report.complete_checkpoint(path, step=i + 1, tokens=0, rank=0)
            t2 = time.perf_counter()
            assert report.check_checkpoint_files(path) is None
            t3 = time.perf_counter()
        ratio = (t3 - t1) / (t1 - t0)
        ratios.append(ratio)
        print(f"{t1 - t0:8.2f} {t2 - t1:10.2f} {t3 - t2:9.2f} {ratio:7.3f}")
    print(f"ratio (checksum at save + verify at load) / save, median: {statistics.median(ratios):.3f} "
          f"(spread {min(ratios):.3f}-{max(ratios):.3f})")
    t = Targets("benchmarks/checkpoint_checksum.py")
    t.check("(checksum + verify) / save, median", statistics.median(ratios), "<=", RATIO_MAX, "x")
    t.exit()


if __name__ == "__main__":
    main()
