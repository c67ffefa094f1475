"""A run's checkpoints on disk: one directory per version, complete or not there at all.

    <out_dir>/checkpoints/step-000120/
        manifest.json          written last: format, version, what it holds, each file's
                               size and sha256
        config.json            the run's config
        controller.json        the controller's state (`controller_json.ControllerState`)
        buffer.pt              the replay buffer's `state_dict` (`torch.save`)
        metrics.jsonl          the metrics rows up to this version
        trained_prompts.jsonl  the prompts each of those steps trained on
        trainer/               the trainer's distributed checkpoint (`trainer_state`)

Atomic: everything is written into a hidden `.step-000120.partial-*` directory, the
manifest last, and only then is the directory renamed to `step-000120` (one `rename`). A
crash mid-write leaves a partial directory that nothing reads (and the next run removes);
`verify` refuses a directory without a manifest, a file missing, shorter or longer than the
manifest says, or one whose bytes do not hash to what it says.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from async_grpo.checkpoint.codec import CheckpointError

FORMAT = "async-grpo-checkpoint"


FORMAT_VERSION = 1


MANIFEST = "manifest.json"
# The files a checkpoint of a run holds besides the manifest (`controller/cut.py`).
CONFIG_FILE = "config.json"
CONTROLLER_FILE = "controller.json"
BUFFER_FILE = "buffer.pt"
TRAINER_DIR = "trainer"
# DCP writes its metadata file last, to a temporary name then renamed, once every rank's
# shards are on disk (`FileSystemWriter.finish`): its presence means the trainer's part of
# a checkpoint is complete, whether or not the trainer lived to say so.
DCP_METADATA = ".metadata"


_STEP = re.compile(r"step-(\d{6,})")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path inside the directory, its size in bytes, and the
    sha256 of its bytes (hex)."""

    path: str
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class CheckpointManifest:
    """What a checkpoint is: the `format` and its `format_version`, the trainer `version`
    it holds (= train steps done), when it was written (ISO 8601, UTC), the trainer
    processes that wrote it, a description of each part it holds, and every file."""

    format: str
    format_version: int
    version: int
    created: str
    trainer_procs: int
    holds: tuple[str, ...]
    files: tuple[FileEntry, ...]


def checkpoints_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def step_name(version: int) -> str:
    return f"step-{version:06d}"


def begin(out_dir: Path, version: int) -> Path:
    """A new, empty partial directory for the checkpoint of `version`."""
    root = checkpoints_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{step_name(version)}.partial-{os.getpid()}-{os.urandom(4).hex()}"
    partial.mkdir()
    return partial


def trainer_written(partial: Path) -> bool:
    """Whether the trainer's distributed checkpoint in `partial` is completely written."""
    return (partial / TRAINER_DIR / DCP_METADATA).is_file()


def finish(partial: Path, version: int, trainer_procs: int, holds: Sequence[str]) -> Path:
    """Hashes every file of `partial`, writes the manifest, and renames the directory to
    its final name (replacing a checkpoint of the same version, if one exists). Blocking:
    run it in a thread."""
    files = tuple(
        FileEntry(str(p.relative_to(partial)), p.stat().st_size, _sha256(p))
        for p in sorted(partial.rglob("*"))
        if p.is_file()
    )
    manifest = CheckpointManifest(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        version=version,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        trainer_procs=trainer_procs,
        holds=tuple(holds),
        files=files,
    )
    text = json.dumps(dataclasses.asdict(manifest), indent=1)
    with (partial / MANIFEST).open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    final = partial.parent / step_name(version)
    if final.exists():
        trash = partial.parent / f".{final.name}.old-{os.urandom(4).hex()}"
        final.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    partial.rename(final)
    return final


def complete(out_dir: Path) -> list[Path]:
    """The complete checkpoints of a run (a manifest present), oldest first."""
    root = checkpoints_dir(out_dir)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP.fullmatch(p.name)) and (p / MANIFEST).is_file()
    ]
    return [p for _, p in sorted(found)]


def prune(out_dir: Path, keep: int) -> list[Path]:
    """Deletes all but the newest `keep` complete checkpoints (0: all); returns those
    deleted."""
    found = complete(out_dir)
    old = found[: max(0, len(found) - keep)]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def remove_partials(out_dir: Path) -> None:
    """Deletes what interrupted writes left behind (never read by anything)."""
    root = checkpoints_dir(out_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".step-"):
                shutil.rmtree(p, ignore_errors=True)


def version_of(path: Path) -> int | None:
    """The version a checkpoint directory's name says, or None for another name."""
    m = _STEP.fullmatch(path.name)
    return int(m.group(1)) if m else None


def read_manifest(path: Path) -> CheckpointManifest:
    """The manifest of checkpoint directory `path`; `CheckpointError` names what is wrong."""
    file = path / MANIFEST
    if not file.is_file():
        raise CheckpointError(
            f"{path} is incomplete: it has no {MANIFEST} (its writing was interrupted, or it "
            "is not a checkpoint)"
        )
    try:
        raw = json.loads(file.read_text())
        files = tuple(FileEntry(**f) for f in raw.pop("files"))
        manifest = CheckpointManifest(**{**raw, "holds": tuple(raw["holds"]), "files": files})
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{file} is not a readable checkpoint manifest ({e})") from None
    if manifest.format != FORMAT or manifest.format_version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is a {manifest.format!r} checkpoint of format version "
            f"{manifest.format_version}; this version reads {FORMAT!r} {FORMAT_VERSION}"
        )
    return manifest


def verify(path: Path) -> CheckpointManifest:
    """The manifest, after checking that every file it lists is there with its size and
    hash; `CheckpointError` names the first file that is not."""
    manifest = read_manifest(path)
    for entry in manifest.files:
        file = path / entry.path
        if not file.is_file():
            raise CheckpointError(f"{path} is damaged: {entry.path} is missing")
        size = file.stat().st_size
        if size != entry.bytes:
            what = "truncated" if size < entry.bytes else "longer than written"
            raise CheckpointError(
                f"{path} is damaged: {entry.path} has {size} bytes, the manifest says "
                f"{entry.bytes} ({what})"
            )
        if _sha256(file) != entry.sha256:
            raise CheckpointError(
                f"{path} is damaged: {entry.path} does not match the sha256 its manifest "
                "records (corrupted)"
            )
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
