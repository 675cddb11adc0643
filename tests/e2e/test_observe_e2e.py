"""`campaign submit --tensorboard DIR` with `observe` (W&B offline) and `notify` set, on a long
run whose rank is SIGKILLed (Parsl, three virtual nodes, real gloo ranks), then `campaign
ledger export --format tensorboard`: what a user finds in each tool, read back with the tool's
own reader (tests/observe/ has the in-process twin and the readers' notes); then `campaign
report --html` of the same campaign, opened in headless Chromium (tests/views/browser.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from e2e_helpers import REPO, Workspace, tiny_spec

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observe"))
sys.path.insert(0, str(REPO / "tests" / "views"))

FAST_WATCHDOG = {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}

PAINTED = """Promise.all([...document.images].map(async i => {
    await i.decode();
    const c = document.createElement('canvas');
    c.width = i.naturalWidth; c.height = i.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(i, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data, colours = new Set();
    let opaque = 0;
    for (let k = 0; k < d.length; k += 4) {
        if (d[k + 3] === 255) opaque++;
        colours.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
    }
    return [opaque / (d.length / 4), colours.size];
})).then(JSON.stringify)"""
"""[share of opaque pixels, distinct colours] of each image of the page, drawn on a canvas."""


def _texts(folder: Path) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(folder), size_guidance={TENSORS: 0})
    acc.Reload()
    return {tag: [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def test_submit_with_observers_drilled_with_a_kill(ws: Workspace) -> None:
    import wandb_file

    spec = tiny_spec("observed", [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 30, "checkpoint_every": 10,
                                   "max_attempts": 3, "backoff_s": 0, "timeout_s": 300, "watchdog": FAST_WATCHDOG,
                                   "faults": [{"kind": "sigkill", "step": 25, "node": "local-n0", "attempt": 1}]}])
    spec["observe"] = {"wandb": {"project": "drill"}}  # the local site's default mode is online: no credentials here
    spec["notify"] = {"command": "cat >> notes.jsonl"}
    path = ws.write_spec(spec)
    r = ws.cli("submit", str(path), "--tensorboard", "tb", CAMPAIGN_ALLOW_FAULTS="1", WANDB_API_KEY="",
               HOME=str(ws.root))  # no ~/.netrc: the run must go offline, with no prompt and no network
    assert r.code == 0, r.out + r.err
    assert "no credentials on this host" in r.out and "wandb sync " in r.out

    board = ws.root / "tb" / "observed" / "long"
    assert sorted(p.name for p in board.iterdir()) == ["attempt-1", "attempt-2", "events"]
    events = _texts(board / "events")
    assert "crashed_node" in events["relaunch"][0] and "excluded local-n0" in events["node_excluded"][0]
    assert "killed by SIGKILL" in events["node_excluded"][0], events["node_excluded"]  # why it was excluded

    [run_dir] = (ws.workdir / "observed" / "wandb").glob("offline-run-*")
    run = wandb_file.read_run(run_dir)
    assert {h["attempt"] for h in run["history"]} == {1, 2} and run["summary"]["state"] == "passed"
    assert any("relaunch" in a["title"] and "crashed_node" in a["text"] for a in run["alerts"])
    assert any("node_excluded" in a["title"] and "killed by SIGKILL" in a["text"] for a in run["alerts"]), run["alerts"]
    assert str(run_dir) in r.out

    notes = [json.loads(line) for line in (ws.root / "notes.jsonl").read_text().splitlines()]
    assert [n["event"] for n in notes] == ["node_excluded", "relaunch", "stage_passed", "campaign_end"]
    assert notes[1]["data"]["exit_class"] == "crashed_node"

    out = ws.root / "after"
    r = ws.cli("ledger", "export", "observed", "--format", "tensorboard", "--out", str(out))
    assert r.code == 0, r.err
    assert _texts(out / "observed" / "long" / "events") == events
    r = ws.cli("ledger", "export", "observed", "--format", "tensorboard")
    assert r.code == 2 and "give --out DIR" in r.err

    # The shareable page of this same campaign, in a real headless Chromium.
    from browser import Browser, chromium_binary

    page_file = ws.root / "share" / "observed.html"
    r = ws.cli("report", "observed", "--html", str(page_file))
    assert r.code == 0 and r.out.strip() == str(page_file), r.err
    with Browser(chromium_binary()) as b:
        page = b.open(page_file, width=1280, height=2000)
        assert page.problems == []  # no console error, failed load or policy violation
        images = json.loads(page.evaluate(
            "JSON.stringify([...document.images].map(i => [i.complete, i.naturalWidth, +i.getAttribute('width'),"
            " i.getBoundingClientRect().width]))"))
        assert len(images) == 3 and all(c and w > 0 and w == a and shown > 0 for c, w, a, shown in images), images
        # Each plot decodes whole: drawn on a canvas, every pixel is opaque (a PNG cut short leaves
        # transparent rows) and the drawing has more than a background's colours.
        painted = json.loads(page.evaluate(PAINTED))
        assert all(opaque == 1 and colours > 20 for opaque, colours in painted), painted
        excluded = page.evaluate("document.getElementById('exclusions').innerText")
        faults = page.evaluate("document.getElementById('faults').innerText")
        page.screenshot(ws.root / "observed.png")
    assert "local-n0" in excluded and "SIGKILL" in excluded, excluded
    assert "crashed_node" in faults, faults
