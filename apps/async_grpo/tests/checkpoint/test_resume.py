"""`--resume` with bad input: a one-line error before any process is spawned, and nothing
on disk changed. The checkpoints are real ones (`made_checkpoints`), written without
Monarch; a good one gets as far as spawning (the positive control)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from async_grpo.checkpoint import disk
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ConfigError
from async_grpo.launch.prepare import prepare
from async_grpo.train import run
from jobs import SPAWN_REFUSED, refuse_spawn
from made_checkpoints import make_checkpoint, tree


@pytest.fixture
def run_dir(tmp_path: Path, tiny_checkpoint: Path) -> Path:
    """A run directory holding checkpoints 2 and 4 of a tiny run."""
    out = tmp_path / "run"
    cfg = apply_overrides(tiny(), {"model.path": str(tiny_checkpoint), "out_dir": str(out)})
    make_checkpoint(cfg, 2)
    make_checkpoint(cfg, 4)
    return out


def refused(args: list[str], root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the command, expects the one-line bad-input error and no change under `root`."""
    before = tree(root)
    assert main(args, spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo: error: "), err
    assert err.count("\n") == 1, err
    assert tree(root) == before
    return err


def test_a_good_checkpoint_gets_as_far_as_spawning(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--resume", "--out_dir", str(run_dir)], spawn=refuse_spawn) == 1
    assert SPAWN_REFUSED in capsys.readouterr().err


def test_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["--resume", "--out_dir", str(tmp_path)], tmp_path, capsys)
    assert f"--resume: no checkpoint in {tmp_path / 'checkpoints'}" in err
    err = refused(["--resume", str(tmp_path / "nowhere")], tmp_path, capsys)
    assert "does not exist" in err
    (tmp_path / "config.json").write_text("{}")
    err = refused(["--resume", str(tmp_path / "config.json")], tmp_path, capsys)
    assert "config.json is a file; give a checkpoint or a run directory" in err


def test_another_config_names_the_fields_that_differ(
    run_dir: Path, tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other-model"
    shutil.copytree(tiny_checkpoint, other)
    args = ["--resume", "--out_dir", str(run_dir), "--sampling.group_size", "8"]
    err = refused([*args, "--model", str(other)], run_dir, capsys)
    assert "was written by a run with another config; these fields differ:" in err
    assert "sampling.group_size (checkpoint '16', here '8')" in err
    assert f"model.path (checkpoint '{tiny_checkpoint}', here '{other}')" in err
    # What may change on resume does not count.
    assert (
        main(
            ["--resume", "--out_dir", str(run_dir), "--steps", "9", "--trainer.procs", "2"],
            spawn=refuse_spawn,
        )
        == 1
    )
    assert SPAWN_REFUSED in capsys.readouterr().err


def test_a_truncated_checkpoint(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = run_dir / "checkpoints" / "step-000004" / "trainer" / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 2)
    err = refused(["--resume", "--out_dir", str(run_dir)], run_dir, capsys)
    assert f"step-000004 is damaged: trainer/__0_0.distcp has {size // 2} bytes" in err
    assert "(truncated)" in err


def test_a_corrupted_checkpoint(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buffer = run_dir / "checkpoints" / "step-000004" / "buffer.pt"
    data = bytearray(buffer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    buffer.write_bytes(data)
    err = refused(["--resume", "--out_dir", str(run_dir)], run_dir, capsys)
    assert "buffer.pt does not match the sha256 its manifest records (corrupted)" in err


def test_an_incomplete_checkpoint(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newest = run_dir / "checkpoints" / "step-000004"
    (newest / "manifest.json").unlink()  # as a crash before the manifest leaves it
    err = refused(["--resume", str(newest)], run_dir, capsys)
    assert "step-000004 is incomplete: it has no manifest.json" in err
    # Without a path, the newest complete one is resumed.
    assert main(["--resume", "--out_dir", str(run_dir)], spawn=refuse_spawn) == 1
    assert SPAWN_REFUSED in capsys.readouterr().err


def test_an_older_checkpoint_into_the_same_run(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = run_dir / "checkpoints" / "step-000002"
    err = refused(["--resume", str(older)], run_dir, capsys)
    assert "holds checkpoints newer than step-000002 (step-000004)" in err


def test_checkpoint_every_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    err = refused(["--checkpoint.every", "0", "--out_dir", str(out)], tmp_path, capsys)
    assert "checkpoint.every must be >= 1 (train steps between checkpoints), got 0" in err
    assert not out.exists()


def test_a_new_run_over_an_unfinished_one_is_refused(
    run_dir: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Checkpoints 2 and 4 of an 800-step run: it stopped early, `--resume` continues it.
    args = ["--out_dir", str(run_dir), "--model", str(tiny_checkpoint)]
    err = refused(args, run_dir, capsys)
    assert "holds the checkpoints of a run that did not finish (the newest is step-000004" in err
    assert "of 800 steps): `--resume` continues it" in err


def test_a_new_run_replaces_a_finished_one(
    tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    cfg = {"model.path": str(tiny_checkpoint), "out_dir": str(out), "steps": "4"}
    make_checkpoint(apply_overrides(tiny(), cfg), 4)  # the end of a 4-step run
    assert main(["--out_dir", str(out), "--model", str(tiny_checkpoint)], spawn=refuse_spawn) == 1
    captured = capsys.readouterr()
    assert SPAWN_REFUSED in captured.err
    assert "the finished run's checkpoints removed (1)" in captured.out
    assert not disk.complete(out)


def test_a_run_started_from_code_over_an_unfinished_one_is_refused(
    run_dir: Path, tiny_checkpoint: Path
) -> None:
    # `cli.run` is what tests and benchmarks call: it must not delete what `--resume` would
    # continue either.
    cfg = apply_overrides(tiny(), {"model.path": str(tiny_checkpoint), "out_dir": str(run_dir)})
    prep = prepare(cfg)
    before = tree(run_dir)
    with pytest.raises(ConfigError, match="holds the checkpoints of a run that did not finish"):
        asyncio.run(run(cfg, prep, quiet=True))
    assert tree(run_dir) == before
