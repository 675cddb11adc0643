"""Heartbeat group files (campaign.report): one in-place slot per node, read back into the same
{node: document} the watchdog names culprits from (no torch)."""

from __future__ import annotations

import os
import time

from campaign import report, watchdog

POLICY = watchdog.WatchdogPolicy(heartbeat_stale_s=10.0)


def _doc(node: str, now: float, ranks: dict[int, tuple[int, str]]) -> dict:
    return {"node": node, "time": now, "ranks": {str(r): {"step": s, "phase": p, "since": now - 1, "time": now,
                                                          "compute_s": 0.5} for r, (s, p) in ranks.items()}}


def _write_slot(run_dir, slot: int, doc: dict) -> None:
    folder = run_dir / report.HEARTBEAT_DIR
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / report.heartbeat_group_file(slot), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, report.encode_heartbeat_slot(doc), report.heartbeat_slot_offset(slot))
    finally:
        os.close(fd)


def test_slot_round_trip_and_torn_or_blank_slots_are_rejected():
    doc = _doc("x4000c0s0b0n0", 5.0, {r: (3, "compute") for r in range(12)})
    rec = report.encode_heartbeat_slot(doc)
    assert len(rec) == report.SLOT_BYTES and report.decode_heartbeat_slot(rec) == doc
    other = report.encode_heartbeat_slot(_doc("x4000c0s0b0n0", 6.0, {r: (4, "collective") for r in range(12)}))
    torn = other[:700] + rec[700:]  # a reader caught a rewrite half way
    assert report.decode_heartbeat_slot(torn) is None
    assert report.decode_heartbeat_slot(bytes(report.SLOT_BYTES)) is None
    huge = _doc("n", 1.0, {r: (1, "compute") for r in range(200)})
    assert report.encode_heartbeat_slot(huge) is None  # too big for a slot: the caller falls back


def test_heartbeat_slot_matches_the_hostfile_spelling(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("x1.hsn.cm\nx2.hsn.cm\nlocal-n2\n")
    assert report.heartbeat_slot(hostfile, "x2") == (1, "x2.hsn.cm")  # PBS FQDN vs short host name
    assert report.heartbeat_slot(hostfile, "local-n2") == (2, "local-n2")
    assert report.heartbeat_slot(hostfile, "x9") is None
    assert report.heartbeat_slot(None, "x1") is None
    assert report.heartbeat_slot(tmp_path / "missing", "x1") is None
    assert report.heartbeat_group_file(255) == "group-00000.slots" and report.heartbeat_group_file(256) == "group-00001.slots"
    assert report.heartbeat_slot_offset(257) == report.SLOT_BYTES


def test_reporter_writes_its_slot_in_place(tmp_path, monkeypatch):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"n{i}.fq\n" for i in range(300)))
    monkeypatch.setenv("CAMPAIGN_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("CAMPAIGN_NODE", "n257")
    monkeypatch.setenv("CAMPAIGN_HOSTFILE", str(hostfile))
    monkeypatch.setenv("CAMPAIGN_ATTEMPT", f"slots-{time.time()}")
    monkeypatch.setenv("CAMPAIGN_HEARTBEAT_INTERVAL", "0.05")
    rep = report.Reporter.from_env(rank=0, local_rank=0, world_size=1)
    rep.phase("compute", 1)
    time.sleep(0.2)
    group = tmp_path / "heartbeats" / "group-00001.slots"
    inode = group.stat().st_ino
    hb = report.read_heartbeats(tmp_path)
    assert list(hb) == ["n257.fq"] and hb["n257.fq"]["ranks"]["0"]["phase"] == "compute"
    rep.close()
    assert group.stat().st_ino == inode  # rewritten in place, never replaced
    assert group.stat().st_size == 2 * report.SLOT_BYTES  # slot 1 of group 1; slot 0 is a hole
    assert report.read_heartbeats(tmp_path)["n257.fq"]["ranks"]["0"]["phase"] == "done"
    assert sorted(p.name for p in (tmp_path / "heartbeats").iterdir()) == ["group-00001.slots"]


def test_culprits_from_group_files_name_the_stale_and_the_silent_node(tmp_path):
    now = 1000.0
    hosts = [f"x{i:05d}" for i in range(600)]  # three group files
    for i, h in enumerate(hosts):
        if i == 417:
            continue  # never beat: "no heartbeat from this node"
        t = now - 40 if i == 3 else now  # local rank 0 of x00003 froze 40 s ago
        _write_slot(tmp_path, i, _doc(h, t, {12 * i + r: (25, "collective") for r in range(12)}))
    (tmp_path / report.HEARTBEAT_DIR / "x00005.json").write_text(  # an older per-node file: both layouts read
        '{"node": "x00005", "time": 1.0, "ranks": {}}')
    beats = report.read_heartbeats(tmp_path)
    assert len(beats) == 599 and beats["x00005"]["time"] == now  # the newer document wins
    found = watchdog.culprits(beats, hosts, now, POLICY)
    assert [(c.node, c.reason) for c in found] == [
        ("x00003", "node heartbeat stale for 40 s"), ("x00417", "no heartbeat from this node")]


def test_read_events_from_reads_only_what_was_appended(tmp_path):
    path = tmp_path / report.EVENTS_FILE
    path.write_text('{"event": "start", "step": 0}\n{"event": "checkpoint_sa')
    events, offset = report.read_events_from(tmp_path)
    assert [e["event"] for e in events] == ["start"]
    with open(path, "a") as f:
        f.write('ved", "step": 10}\n')
    events, offset = report.read_events_from(tmp_path, offset)
    assert [e["event"] for e in events] == ["checkpoint_saved"]
    assert report.read_events_from(tmp_path, offset) == ([], offset)
    assert report.read_events_from(tmp_path / "nope") == ([], 0)
