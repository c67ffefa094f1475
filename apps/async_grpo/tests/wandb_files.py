"""Reading back what an offline W&B run wrote, without W&B's server API: its run directory
and the records of its `.wandb` file.

The `.wandb` file is W&B's transaction log, the one `wandb sync` uploads: a 7-byte header
(":W&B", magic 0xBEE1, version 0), then LevelDB's log format (32 KiB blocks; records with a
7-byte header: CRC32C, length, type FULL/FIRST/MIDDLE/LAST, split across blocks) whose
payloads are `wandb_internal_pb2.Record` protobufs, the schema W&B ships with the package.
W&B's service process writes the file on its own time: `finish()` can return before the
last records are on disk, so a reader waits for the run's `exit` record, written last.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclasses.dataclass
class OfflineRun:
    """What one offline run logged: `history` rows (key -> JSON-decoded value, nested keys
    joined with "/"), `config` (the top-level keys, JSON-decoded), `files` saved."""

    dir: Path
    history: list[dict[str, Any]]
    config: dict[str, Any]
    files: list[str]


def run_dirs(out_dir: Path) -> list[Path]:
    """The W&B run directories under `<out_dir>/wandb/`, oldest first."""
    return sorted((out_dir / "wandb").glob("*run-*"))


def _payloads(data: bytes) -> list[bytes]:
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out: list[bytes] = []
    pos, parts = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zeros: the rest of the block is unused
            pos += left
            continue
        if pos + _HEADER + length > len(data):  # not all written yet
            break
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            parts = chunk
        elif kind == _MIDDLE:
            parts += chunk
        elif kind == _LAST:
            out.append(parts + chunk)
    return out


def _records(log: Path, timeout_s: float) -> list[Any]:
    """The records of a finished run's log, once its `exit` record is there."""
    from wandb.proto import wandb_internal_pb2 as pb  # noqa: PLC0415

    deadline = time.monotonic() + timeout_s
    while True:
        records = []
        for payload in _payloads(log.read_bytes()):
            record = pb.Record()  # type: ignore[attr-defined,unused-ignore]  # generated
            record.ParseFromString(payload)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{log}: no exit record after {timeout_s}s"
        time.sleep(0.1)


def read_offline_run(run_dir: Path, timeout_s: float = 60.0) -> OfflineRun:
    """Every history row, the config and the saved files of the finished run in `run_dir`
    (waiting up to `timeout_s` for W&B to have written them)."""
    (log,) = run_dir.glob("*.wandb")
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    files: list[str] = []
    for record in _records(log, timeout_s):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
        elif kind == "files":
            files += [f.path for f in record.files.files]
    return OfflineRun(run_dir, history, config, files)
