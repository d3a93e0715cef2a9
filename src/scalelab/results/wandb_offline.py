"""Read an offline W&B run back without syncing it (wandb 0.31 has no reader for `.wandb`).

Format (LevelDB-log style): 7-byte header `:W&B` + uint16 0xBEE1 + uint8 version, then 32 KiB
blocks of records framed as <crc32:uint32, length:uint16, type:uint8> with type FULL=1,
FIRST=2, MIDDLE=3, LAST=4; each assembled payload is a wandb_internal_pb2.Record.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

_HEADER = 7
_BLOCK = 32 * 1024
_FRAME = struct.Struct("<IHB")


def _payloads(data: bytes):
    pos, pending = _HEADER, b""
    while pos + _FRAME.size <= len(data):
        room = _BLOCK - (pos % _BLOCK)
        if room < _FRAME.size:  # block trailer too small for a frame: skip to the next block
            pos += room
            continue
        _, length, kind = _FRAME.unpack_from(data, pos)
        if length == 0 and kind == 0:
            pos += room
            continue
        body = data[pos + _FRAME.size: pos + _FRAME.size + length]
        pos += _FRAME.size + length
        if kind == 1:
            yield body
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            yield pending + body
            pending = b""


def read_run(path: Path | str) -> dict:
    """{'config': {...}, 'history': [{key: value}], 'summary': {...}, 'run': {group, job_type, ...},
    'exit_code': the run's exit code (None: never finished)}"""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict = {"config": {}, "history": [], "summary": {}, "run": {}, "exit_code": None}
    for payload in _payloads(Path(path).read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "config":
            out["config"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
        elif kind == "run":
            r = rec.run
            out["run"] = {"run_id": r.run_id, "group": r.run_group, "job_type": r.job_type,
                          "project": r.project, "name": r.display_name}
            out["config"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update})
    return out


def find_runs(root: Path | str) -> list[Path]:
    return sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
