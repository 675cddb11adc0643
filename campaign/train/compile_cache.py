"""Where torch.compile keeps its caches for one rank of one attempt (stdlib only).

With `trainer.compile_cache: true` (the default) and `compile: true`, the driver names a
folder the campaign owns on the shared filesystem (`<campaign>/compile-cache`, RunConfig's
`compile_cache_dir`) and each rank keeps Inductor's FX graph cache, the AOTAutograd cache
and Triton's kernels in its own subfolder `rank-R` of it (TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR). A relaunch, on the same node or a spare, then loads the compiled graphs
instead of compiling them again; Dynamo's tracing still runs.

One folder per rank, not one shared by all: a cache shared across ranks can hand one rank code
specialised for another (pytorch issue 188332), so each rank only ever reads what it wrote. The
stages of a campaign share the folder: the cache keys hold the graph, its shapes, the config and
the versions of torch and Triton, so a stage with another model or batch compiles its own.

Without a folder (`compile_cache: false`, or a trainer run by hand with no `compile_cache_dir`),
every start compiles from nothing: a fresh private folder per process, removed at exit, as on a
node that never compiled this model. torch's own default (/tmp/torchinductor_USER) would be
warm or cold depending on which node the rank lands on.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
FOLDER = "compile-cache"
"""The campaign's folder (in its version's root, beside the stage folders)."""


def rank_folder(root: str, rank: int) -> str:
    return os.path.join(root, f"rank-{rank}")


def configure(root: str | None, rank: int, environ: os._Environ[str] | dict[str, str] | None = None) -> dict[str, str]:
    """Point torch.compile's caches for this process at `root`/rank-R (or, with no root, at a
    fresh private folder removed at exit). Must run before the first compilation (Inductor reads
    the variables when it compiles). Returns what was set, for the start-up record."""
    env = os.environ if environ is None else environ
    if root:
        base = rank_folder(root, rank)
        os.makedirs(base, exist_ok=True)
        mode = "campaign"
    else:
        base = tempfile.mkdtemp(prefix=f"campaign-compile-rank{rank}-")
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        mode = "private"
    env["TORCHINDUCTOR_CACHE_DIR"] = base
    env["TRITON_CACHE_DIR"] = os.path.join(base, "triton")
    return {"mode": mode, "dir": base}
