"""W&B from the driver (never the ranks): one run per stage (needs the `wandb` extra).

A stage's run starts at its first step or event and ends with the stage (passed: exit 0;
failed, skipped, or the driver gone: exit 1). Every attempt logs into it as the steps go on:
`trainer/step` is the x-axis of every metric and `attempt` says which launch wrote a point,
so a relaunch that resumes from step 20 after step 27 shows as attempt 2 from step 21.
Relaunches, exclusions, confirmed findings, rescues and a failed stage are alerts (with the
cause in their text), and the stage's verdict is in the run's summary.

Offline (the default on sites whose compute nodes have no internet, and whenever this host
has no W&B credentials) the runs go to FOLDER/wandb/offline-run-*; the driver prints the
`wandb sync` command that uploads them from a node with internet. Offline never touches the
network: no login, no prompt.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from campaign.observe.base import Observer, Record

if TYPE_CHECKING:
    from campaign.observe.config import WandbConfig
    from campaign.spec import CampaignSpec

METRICS = ("loss", "lr", "tokens", "tokens_per_s", "step_time_s", "mem_peak_gib", "mfu", "mfu_float8", "comm_time_s",
           "grad_norm")
"""Fields of a metrics.jsonl row logged (under the same names), when present."""

ALERTS = {"relaunch": "WARN", "node_excluded": "WARN", "confirmed": "WARN", "rescue": "INFO", "straggler": "INFO"}
"""Ledger event kinds that become alerts of the stage's run, with their level (a failed stage: ERROR)."""

STEP = "trainer/step"


class Wandb(Observer):
    """One W&B run per (version, stage) of the campaign."""

    def __init__(self, config: WandbConfig, *, mode: str, folder: Path, spec: CampaignSpec) -> None:
        import wandb

        self.wandb, self.config, self.folder, self.spec = wandb, config, folder, spec
        self.mode = mode if mode == "offline" or _has_credentials() else "offline"
        self.note = None if self.mode == mode else \
            "W&B: no credentials on this host (WANDB_API_KEY or ~/.netrc): logging offline instead"
        self._runs: dict[tuple[int, str], Any] = {}
        self._dirs: list[str] = []

    def _settings(self) -> Any:
        return self.wandb.Settings(mode=self.mode, silent=True, console="off", x_disable_stats=True,
                                   x_disable_meta=True, disable_git=True, save_code=False, disable_job_creation=True)

    def _run(self, version: int | None, stage: str) -> Any:
        key = (version or 1, stage)
        run = self._runs.get(key)
        if run is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            kind = next((s.kind for s in self.spec.stages if s.resolved_name == stage), None)
            suffix = f"-v{key[0]}" if key[0] > 1 else ""
            init = {"project": self.config.project, "entity": self.config.entity, "dir": str(self.folder),
                    "name": f"{self.spec.name}{suffix}/{stage}", "group": f"{self.spec.name}{suffix}",
                    "job_type": kind, "reinit": "create_new",
                    "config": {"campaign": self.spec.name, "version": key[0], "stage": stage, "kind": kind,
                               "site": self.spec.site.kind, "model": self.spec.model.model_dump(mode="json")}}
            try:
                run = self.wandb.init(**init, settings=self._settings())
            except Exception as e:  # noqa: BLE001 - online: the server, the network, the key
                if self.mode == "offline":
                    raise
                self.mode, self.note = "offline", f"W&B online failed ({type(e).__name__}: {e}); logging offline instead"
                run = self.wandb.init(**init, settings=self._settings())
            run.define_metric(STEP)
            run.define_metric("*", step_metric=STEP)
            self._runs[key] = run
            self._dirs.append(str(Path(run.dir).parent))
        return run

    def steps(self, stage: str, attempt: int, rows: Sequence[dict[str, Any]], *, version: int = 1) -> None:
        run = self._run(version, stage)
        for row in rows:
            point = {k: row[k] for k in METRICS if isinstance(row.get(k), (int, float)) and not isinstance(row[k], bool)}
            run.log({STEP: int(row["step"]), "attempt": attempt, **point})

    def events(self, records: Sequence[Record]) -> None:
        for r in records:
            if not r.get("stage"):
                continue
            kind, to = r["kind"], (r.get("data") or {}).get("to")
            if kind == "stage_state" and to == "running":
                self._run(r["version"], r["stage"])
            elif kind in ALERTS:
                self._alert(r, ALERTS[kind])
            elif kind == "stage_state" and to in ("passed", "failed", "skipped"):
                self._end(r, to)

    def _alert(self, r: Record, level: str) -> None:
        run = self._run(r["version"], r["stage"])
        where = f" (attempt {r['attempt']})" if r.get("attempt") else ""
        # A title of its own (W&B holds back a repeat of one title for wait_duration).
        run.alert(title=f"{self.spec.name}/{r['stage']}: {r['kind']}{where} #{r.get('id')}", text=r["message"],
                  level=getattr(self.wandb.AlertLevel, level))

    def _end(self, r: Record, state: str) -> None:
        if state == "skipped" and (r["version"] or 1, r["stage"]) not in self._runs:
            return  # never ran (an earlier stage failed): no run for it
        run = self._run(r["version"], r["stage"])
        if state == "failed":
            run.alert(title=f"{self.spec.name}/{r['stage']}: stage failed #{r.get('id')}", text=r["message"],
                      level=self.wandb.AlertLevel.ERROR)
        run.summary["state"] = state
        run.summary["verdict"] = r["message"]
        run.finish(exit_code=0 if state == "passed" else 1)
        self._runs.pop((r["version"] or 1, r["stage"]), None)

    def close(self) -> list[str]:
        for run in self._runs.values():  # stages the driver left unfinished (it was cancelled or gave up)
            run.finish(exit_code=1)
        self._runs.clear()
        self.wandb.teardown()  # stops W&B's service process: nothing outlives the driver
        lines = [self.note] if self.note else []
        if self.mode == "offline" and self._dirs:
            lines.append(f"W&B: {len(self._dirs)} offline run(s); upload them from a node with internet with:")
            lines.append(f"  wandb sync {' '.join(self._dirs)}")
        return lines


def _has_credentials() -> bool:
    """Whether this host can log in to W&B without asking: WANDB_API_KEY, or a ~/.netrc entry
    for the W&B host (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return bool(host and netrc.netrc().authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False
