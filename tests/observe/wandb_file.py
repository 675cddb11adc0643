"""Read a W&B run's transaction log (`run-ID.wandb`) back, for the tests.

wandb 0.31 has no Python reader of its own any more (`wandb.sdk.internal.datastore` went
with the Go core, which writes the file). The file is LevelDB's log format (documented at
https://github.com/google/leveldb/blob/main/doc/log_format.md, with W&B's 7-byte header
":W&B", 0xBEE1, version 0), each record one `wandb.proto.wandb_internal_pb2.Record`: this
reader does only the framing (the narrow boundary we reimplement) and hands each record to
wandb's own protobuf class, so what the tests read is what `wandb sync` uploads.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the file, in order, as wandb's `Record` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    out, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # the block's trailer: zeros
            pos += BLOCK - pos % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue  # zero padding written ahead of a block's end
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum, f"bad checksum at {pos}"
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


def read_run(run_dir: Path) -> dict[str, Any]:
    """What one offline run holds: its run record (name, group, project, job type), config,
    history rows (dicts), alerts, summary and whether it exited."""
    files = list(run_dir.glob("run-*.wandb"))
    assert len(files) == 1, files
    run: dict[str, Any] = {"history": [], "alerts": [], "summary": {}, "config": {}, "exit": None}
    for rec in records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.update(id=r.run_id, name=r.display_name, group=r.run_group, project=r.project, job_type=r.job_type)
            run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            run["history"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
        elif kind == "alert":
            run["alerts"].append({"title": rec.alert.title, "text": rec.alert.text, "level": rec.alert.level})
        elif kind == "summary":
            run["summary"].update({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                   for i in rec.summary.update})
        elif kind == "exit":
            run["exit"] = rec.exit.exit_code
    return run
