"""campaign.report: writers and readers of the trainer contract (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from campaign import report
from train_helpers import REPO


def test_read_metrics_tolerates_a_partial_last_line(tmp_path):
    path = tmp_path / report.METRICS_FILE
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    rows, offset = report.read_metrics(tmp_path)
    assert rows == [{"step": 1, "loss": 2.0}]
    with open(path, "a") as f:
        f.write('ss": 1.5}\n')
    rows, offset2 = report.read_metrics(tmp_path, offset)
    assert rows == [{"step": 2, "loss": 1.5}]
    assert report.read_metrics(tmp_path, offset2) == ([], offset2)


def test_readers_on_an_empty_run_dir(tmp_path):
    assert report.read_metrics(tmp_path) == ([], 0)
    assert report.read_events(tmp_path) == []
    assert report.read_heartbeats(tmp_path) == {}
    assert report.read_startup(tmp_path) is None
    assert report.list_checkpoints(tmp_path / "nope") == []


def test_reporter_writes_metrics_events_heartbeats(tmp_path, monkeypatch):
    monkeypatch.setenv("CAMPAIGN_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("CAMPAIGN_NODE", "n7")
    monkeypatch.setenv("CAMPAIGN_ATTEMPT", f"test-{time.time()}")
    monkeypatch.setenv("CAMPAIGN_HEARTBEAT_INTERVAL", "0.05")
    rep = report.Reporter.from_env(rank=0, local_rank=0, world_size=1)
    rep.event("start", 0)
    rep.phase("compute", 1)
    rep.step(step=1, tokens=10, loss=3.5, step_time_s=0.1, lr=1e-3)
    time.sleep(0.2)
    hb = report.read_heartbeats(tmp_path)["n7"]
    assert hb["ranks"]["0"]["phase"] == "compute" and hb["ranks"]["0"]["step"] == 1
    rep.close()
    assert report.read_heartbeats(tmp_path)["n7"]["ranks"]["0"]["phase"] == "done"
    (row,), _ = report.read_metrics(tmp_path)
    assert row["loss"] == 3.5 and row["tokens"] == 10 and "time" in row
    assert report.read_events(tmp_path)[0]["event"] == "start"
    assert list((tmp_path / "heartbeats").iterdir()) == [tmp_path / "heartbeats" / "n7.json"]


def test_other_ranks_write_nothing_to_the_run_dir(tmp_path):
    rep = report.Reporter(tmp_path, rank=1, local_rank=1, world_size=2, node="x",
                          attempt=f"t{time.time()}", interval=10)
    rep.step(step=1, tokens=1, loss=1.0, step_time_s=1.0)
    rep.event("done", 1)
    rep.close()
    assert report.read_metrics(tmp_path) == ([], 0)
    assert report.read_events(tmp_path) == []
    assert report.read_heartbeats(tmp_path) == {}


# A rank 0 that writes a metrics row per step; after each row it says so on stdout and, when
# told to pace, waits for a line on stdin before the next step.
WRITER = """
import sys, time
from campaign import report
run_dir, pace = sys.argv[1], sys.argv[2] == "pace"
rep = report.Reporter(run_dir, rank=0, local_rank=0, world_size=1, node="w",
                      attempt=f"w{time.time()}", interval=10)
rep.event("start", 0)
step = 0
while True:
    step += 1
    rep.step(step=step, tokens=step, loss=1.0, step_time_s=0.001, note="x" * 2000)
    if pace:
        print(step, flush=True)
        sys.stdin.readline()
"""


def _writer(tmp_path, pace: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "pace" if pace else "go"],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_metrics_row_is_readable_by_another_process_as_soon_as_the_step_returns(tmp_path):
    proc = _writer(tmp_path, pace=True)
    try:
        offset = 0
        for step in (1, 2, 3):
            assert proc.stdout.readline().strip() == str(step)  # the writer is still running
            rows, offset = report.read_metrics(tmp_path, offset)
            assert [r["step"] for r in rows] == [step]
            proc.stdin.write("\n")
            proc.stdin.flush()
        assert report.read_events(tmp_path)[0]["event"] == "start"
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_killed_mid_run_leaves_only_whole_rows(tmp_path):
    """SIGKILL while rows of 2 KB are written as fast as they can be: every line in the file
    is a whole, valid row, and a cut last row is never read. (Linux may cut a write() to a
    regular file short when a fatal signal arrives between pages: the file ended mid-row once
    in 4 clean-clone CI runs, so "the file ends at a line's end" is not a promise the kernel
    makes; that the reader stops before the cut is ours.)"""
    proc = _writer(tmp_path, pace=False)
    path = tmp_path / report.METRICS_FILE
    deadline = time.monotonic() + 30
    while (not path.exists() or path.stat().st_size < 2_000_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1  # the end of the last whole row; a cut row may follow it
    assert b"\n" not in data[whole:] and len(data) - whole < 2100, "at most one cut row, at the end"
    got = report.read_metrics_checked(tmp_path)
    assert got.bad == 0 and got.offset == whole, "the cut row is neither read nor counted as bad"
    assert [r["step"] for r in got.rows] == list(range(1, len(got.rows) + 1))
    assert len(got.rows) == data.count(b"\n") > 100


def test_reporter_keeps_its_files_open_until_close_and_reopens_after(tmp_path):
    rep = report.Reporter(tmp_path, rank=0, local_rank=0, world_size=1, node="x",
                          attempt=f"t{time.time()}", interval=10)
    for step in (1, 2, 3):
        rep.step(step=step, tokens=step, loss=1.0, step_time_s=0.1)
        rep.event("checkpoint_saved", step)
    assert set(rep._fds) == {report.METRICS_FILE, report.EVENTS_FILE}  # one open each, kept
    rep.close()
    assert rep._fds == {}
    rep.event("done", 3)  # late (a checkpoint thread's event): still written, not lost
    rows, _ = report.read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [e["event"] for e in report.read_events(tmp_path)] == ["checkpoint_saved"] * 3 + ["done"]
    rep.close()


def test_events_from_two_threads_never_share_a_line(tmp_path):
    import threading

    rep = report.Reporter(tmp_path, rank=0, local_rank=0, world_size=1, node="x",
                          attempt=f"t{time.time()}", interval=10)

    def write(tag: str) -> None:
        for i in range(300):
            rep.event("checkpoint_saved", i, path=tag * 3000)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep.close()
    events = report.read_events(tmp_path)
    assert len(events) == 600
    assert all(e["path"] in ("a" * 3000, "b" * 3000) for e in events)


def test_list_checkpoints(tmp_path):
    for step, complete in ((10, True), (20, False)):
        d = tmp_path / report.checkpoint_name(step)
        d.mkdir()
        (d / report.META_FILE).write_text(json.dumps({"step": step, "tokens": step * 100}))
        if complete:
            (d / report.COMPLETE_MARKER).write_text("")
    cks = report.list_checkpoints(tmp_path)
    assert [(c["step"], c["tokens"], c["complete"]) for c in cks] == [(10, 1000, True),
                                                                      (20, 2000, False)]
    assert cks[0]["path"].endswith("step-00000010")


def test_report_and_train_package_import_no_torch():
    code = ("import sys, campaign.report, campaign.train, campaign.train.config; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


GOOD = '{"step": 1, "tokens": 10, "loss": 2.0, "step_time_s": 0.1}\n'
GARBAGE = [
    ("a bare number", "42", "not a JSON object"),
    ("a list", "[1, 2]", "not a JSON object"),
    ("a string", '"step 3"', "not a JSON object"),
    ("null", "null", "not a JSON object"),
    ("not JSON", "step=3 loss=2.0", "not JSON"),
    ("not UTF-8", b"\xff\xfe{}".decode("latin-1"), "not JSON"),
    ("a string step", '{"step": "3", "tokens": 30, "loss": 2.0}', "step '3'"),
    ("a float step", '{"step": 3.0, "tokens": 30, "loss": 2.0}', "step 3.0"),
    ("a fractional step", '{"step": 3.5, "tokens": 30, "loss": 2.0}', "step 3.5"),
    ("a bool step", '{"step": true, "tokens": 30, "loss": 2.0}', "step True"),
    ("a negative step", '{"step": -1, "tokens": 30, "loss": 2.0}', "step -1"),
    ("a huge step", '{"step": 10000000000000, "tokens": 30, "loss": 2.0}', "step 10000000000000"),
    ("a null step", '{"step": null, "tokens": 30, "loss": 2.0}', "step None"),
    ("no step", '{"tokens": 30, "loss": 2.0}', "no step"),
    ("NaN tokens", '{"step": 3, "tokens": NaN, "loss": 2.0}', "tokens nan"),
    ("1e30 tokens", '{"step": 3, "tokens": 1e30, "loss": 2.0}', "tokens 1e+30"),
    ("huge int tokens", '{"step": 3, "tokens": 1000000000000000001, "loss": 2.0}', "tokens 1000000000000000001"),
    ("float tokens", '{"step": 3, "tokens": 30.0, "loss": 2.0}', "tokens 30.0"),
    ("string tokens", '{"step": 3, "tokens": "30", "loss": 2.0}', "tokens '30'"),
    ("bool tokens", '{"step": 3, "tokens": false, "loss": 2.0}', "tokens False"),
    ("negative tokens", '{"step": 3, "tokens": -30, "loss": 2.0}', "tokens -30"),
    ("no loss", '{"step": 3, "tokens": 30}', "no loss"),
    ("a string loss", '{"step": 3, "tokens": 30, "loss": "2.0"}', "loss '2.0'"),
    ("a bool loss", '{"step": 3, "tokens": 30, "loss": true}', "loss True"),
    ("a list loss", '{"step": 3, "tokens": 30, "loss": [2.0]}', "loss [2.0]"),
    ("a huge int loss", '{"step": 3, "tokens": 30, "loss": ' + "9" * 400 + "}", "is not a number"),
    ("a NaN step time", '{"step": 3, "tokens": 30, "loss": 2.0, "step_time_s": NaN}', "step_time_s nan"),
    ("a string step time", '{"step": 3, "tokens": 30, "loss": 2.0, "step_time_s": "0.1"}', "step_time_s '0.1'"),
    ("a negative step time", '{"step": 3, "tokens": 30, "loss": 2.0, "step_time_s": -1}', "step_time_s -1"),
]


@pytest.mark.parametrize(("line", "why"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_read_metrics_skips_and_counts_garbage_rows(tmp_path, line, why):
    path = tmp_path / report.METRICS_FILE
    path.write_bytes(GOOD.encode() + line.encode("latin-1" if "\xff" in line else "utf-8") + b"\n"
                     + GOOD.replace('"step": 1', '"step": 2').encode())
    got = report.read_metrics_checked(tmp_path)
    assert [r["step"] for r in got.rows] == [1, 2]
    assert got.bad == 1 and got.offset == path.stat().st_size
    assert got.problems[0].startswith("line 2: ") and why in got.problems[0]
    assert report.read_metrics(tmp_path) == (got.rows, got.offset)


@pytest.mark.parametrize(("loss", "expected"), [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("null", "nan"), ("3", "3.0"), ("2.5", "2.5"),
])
def test_read_metrics_keeps_non_finite_and_null_loss_as_evidence(tmp_path, loss, expected):
    (tmp_path / report.METRICS_FILE).write_text(f'{{"step": 5, "tokens": 50, "loss": {loss}}}\n')
    got = report.read_metrics_checked(tmp_path)
    assert got.bad == 0 and len(got.rows) == 1
    value = got.rows[0]["loss"]
    assert isinstance(value, float) and repr(value) == expected


def test_read_metrics_accepts_rows_without_tokens_and_with_null_step_time(tmp_path):
    (tmp_path / report.METRICS_FILE).write_text('{"step": 0, "loss": 1.0}\n\n{"step": 7, "tokens": 0, "loss": 1.0, '
                                                '"step_time_s": null, "lr": "cosine"}\n')
    got = report.read_metrics_checked(tmp_path)
    assert [r["step"] for r in got.rows] == [0, 7] and got.bad == 0  # blank lines are not counted


def test_read_metrics_checked_leaves_a_partial_garbage_line_for_the_next_read(tmp_path):
    path = tmp_path / report.METRICS_FILE
    path.write_text(GOOD + '{"step": "x')
    got = report.read_metrics_checked(tmp_path)
    assert (len(got.rows), got.bad, got.offset) == (1, 0, len(GOOD))
    with open(path, "a") as f:
        f.write('", "loss": 1}\n' + "7\n" * 10)
    got2 = report.read_metrics_checked(tmp_path, got.offset, line=got.line)
    assert got2.rows == [] and got2.bad == 11 and len(got2.problems) == 5
    assert got2.problems[0].startswith("line 2: step 'x'")
    assert report.read_metrics_checked(tmp_path, got2.offset)[:4] == ([], got2.offset, 0, [])


def _rows(steps, *, t0=1000.0, dt=0.1, tokens_per_step=8):
    return [{"step": s, "tokens": s * tokens_per_step, "loss": 2.0, "step_time_s": dt, "time": t0 + s * dt}
            for s in steps]


FORGED = {"step": 999, "loss": 1.0, "tokens": 1}
"""Issue 39, item 2: the row an adversary appended to a running attempt's metrics.jsonl."""


@pytest.mark.parametrize("forged", [FORGED, {"step": 999, "loss": 1.0, "tokens": 10**6, "time": 1010.85},
                                    {"step": 500, "loss": 1.0}])
def test_one_forged_row_ahead_is_rejected_and_the_real_rows_after_it_kept(tmp_path, forged):
    """Issue 39, item 2: a row inside the attempt's range but ahead of what the trainer wrote
    (tokens going back, or plausible tokens and time stamp, or a bare row) is rejected and
    counted; every real row after it is kept (before: the forged row stored, 890 real rows
    rejected as "step 109 does not follow step 999")."""
    rows = _rows(range(1, 109))
    lines = [json.dumps(r) for r in rows] + [json.dumps(forged)] + [json.dumps(r) for r in _rows(range(109, 1001))]
    (tmp_path / report.METRICS_FILE).write_text("\n".join(lines) + "\n")
    got = report.read_metrics_checked(tmp_path, max_step=1000)
    assert [r["step"] for r in got.rows] == list(range(1, 1001))
    assert got.bad == 1 and got.problems[0].startswith("line 109: "), got.problems
    assert f"\"step\": {forged['step']}" in got.problems[0]


def test_a_chain_decides_the_same_however_the_reads_cut_the_file(tmp_path):
    """The driver reads metrics.jsonl every second while the trainer writes: the same rows are
    kept, and the same ones rejected, whether one read or many see them (a held row survives
    the cut between two reads)."""
    path = tmp_path / report.METRICS_FILE
    lines = ([json.dumps(r) for r in _rows(range(1, 6))] + [json.dumps(FORGED | {"tokens": 10**6, "time": 1000.55})]
             + [json.dumps(r) for r in _rows(range(6, 11))] + ['{"step": 3, "loss": 1.0, "tokens": 24, "time": 1000.3}'])
    chain, offset, line, kept, bad = report.StepChain(max_step=1000), 0, 1, [], 0
    for text in lines:
        with open(path, "a") as f:
            f.write(text + "\n")
        got = report.read_metrics_checked(tmp_path, offset, line=line, chain=chain)
        offset, line, kept, bad = got.offset, got.line, kept + got.rows, bad + got.bad
        if text == lines[5]:
            assert got.rows == [] and chain.tip == 999, "the jump is held until the next row"
    kept += chain.end()
    whole = report.read_metrics_checked(tmp_path, max_step=1000)
    assert [r["step"] for r in kept] == [r["step"] for r in whole.rows] == list(range(1, 11))
    assert bad == whole.bad == 2


def test_a_trainer_that_logs_every_tenth_step_waits_only_for_its_first_jump(tmp_path):
    """Rows 10 steps apart (nanoGPT's log_interval): the first jump waits for the next row;
    after it, a jump of the stride seen is taken at once; a row at the end is taken by end()."""
    chain = report.StepChain(max_step=100)
    took = []
    for r in _rows([1, 11, 21, 31]):
        took.append([x["step"] for x in chain.add(r, r["step"], b"")[0]])
    assert took == [[1], [], [11, 21], [31]]
    chain.add(_rows([61])[0], 61, b"")
    assert [r["step"] for r in chain.end()] == [61]


def test_a_resumed_attempts_first_row_is_taken_at_once_and_a_forged_first_row_refuted():
    chain = report.StepChain(max_step=100, start=50)
    assert [r["step"] for r in chain.add(_rows([51])[0], 1, b"")[0]] == [51]
    chain = report.StepChain(max_step=100)
    assert chain.add(FORGED | {"step": 99}, 1, b"x") == ([], [])
    taken, refused = chain.add(_rows([1])[0], 2, b"")
    assert [r["step"] for r in taken] == [1] and refused[0][0] == 1 and "step 99 is not the trainer's" in refused[0][1]


@pytest.mark.parametrize(("row", "why"), [
    ({"step": 6, "tokens": 8, "loss": 1.0, "time": 1000.6}, "tokens 8 go back from the 40 of step 5"),
    ({"step": 6, "tokens": 48, "loss": 1.0}, "no time stamp, where step 5's row has one"),
    ({"step": 6, "tokens": 48, "loss": 1.0, "time": 900.0}, "time stamp 900.000 is before step 5's"),
])
def test_rows_the_trainer_cannot_have_written_are_rejected_at_once(row, why):
    chain = report.StepChain(max_step=100)
    for r in _rows(range(1, 6)):
        chain.add(r, r["step"], b"")
    taken, refused = chain.add(row, 6, b"")
    assert taken == [] and refused[0][1].startswith(why), refused
