"""One node's heartbeat slot in a group file, the format its writer and its reader share
(stdlib only, imports nothing).

`heartbeats/group-GGGGG.slots` holds HEARTBEAT_GROUP nodes: node i of the hostfile owns the
SLOT_BYTES-byte slot (i % HEARTBEAT_GROUP) of group i // HEARTBEAT_GROUP. The node's local rank
0 (`campaign.report.Reporter`) overwrites its slot in place every heartbeat interval
(`encode_heartbeat_slot`); the supervisor reads every slot (`campaign.runfiles.read_heartbeats`,
`decode_heartbeat_slot`).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

HEARTBEAT_GROUP = 256
"""Nodes per heartbeat group file: 42 files at 10,624 nodes, so a reader opens 42 files, not 10,624."""
SLOT_BYTES = 4096
"""One node's slot in a group file: one page, so two nodes never write the same page (Lustre
extent locks are page-granular). 12 ranks' states take ~1.5 KB; a node whose document does not
fit falls back to its own `<node>.json`."""


def heartbeat_group_file(slot: int) -> str:
    """Name (under heartbeats/) of the group file that holds hostfile slot `slot`."""
    return f"group-{slot // HEARTBEAT_GROUP:05d}.slots"


def heartbeat_slot_offset(slot: int) -> int:
    """Byte offset of slot `slot` in its group file."""
    return (slot % HEARTBEAT_GROUP) * SLOT_BYTES


def encode_heartbeat_slot(doc: dict[str, Any]) -> bytes | None:
    """One slot: `<crc32 hex> <json>\\n`, space-padded to SLOT_BYTES; None if it does not fit.

    The CRC lets a reader reject a slot torn by a concurrent rewrite (a single write is atomic
    against reads on Lustre, not on every local filesystem)."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    rec = b"%08x %s\n" % (zlib.crc32(body), body)
    if len(rec) > SLOT_BYTES:
        return None
    return rec.ljust(SLOT_BYTES, b" ")


def decode_heartbeat_slot(rec: bytes) -> dict[str, Any] | None:
    """The document of one slot; None if never written (zeros) or torn (CRC mismatch)."""
    end = rec.find(b"\n")
    if end < 10 or rec[8:9] != b" ":
        return None
    body = rec[9:end]
    try:
        if int(rec[:8], 16) != zlib.crc32(body):
            return None
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
