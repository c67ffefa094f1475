"""`async-grpo export`: a checkpoint as a Hugging Face model directory, and every bad input
refused with one line, exit status 2 and nothing written.

Real checkpoints written without Monarch (`made_checkpoints`: the trainer's DCP state of a
`TrainerCore`, the controller's files, the manifest), a real tiny Qwen2 base model, and the
export loaded back with `AutoModelForCausalLM.from_pretrained`. Exports of checkpoints that
whole runs wrote: `tests/runs/test_export_eval.py`, `tests/runs/test_fault_tolerance.py` (a
sharded trainer's).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import stat
from pathlib import Path

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.export import EXPORT_FILE, export, read_export_info
from async_grpo.checkpoint.trainer_state import load_trainer_state
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import TINY_ARCH, tiny
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import load_policy, write_random_checkpoint
from async_grpo.tasks.prompts import corpus_for
from made_checkpoints import make_checkpoint, tree
from peft import PeftModel
from transformers import AutoModelForCausalLM


@pytest.fixture
def run_dir(tmp_path: Path, tiny_checkpoint: Path) -> Path:
    """A run directory holding checkpoints 2 and 4, each with weights of its own."""
    out = tmp_path / "run"
    overrides = {"model.path": str(tiny_checkpoint), "out_dir": str(out)}
    cfg = apply_overrides(tiny(), {**overrides, "sampling.temperature": "0.7"})
    make_checkpoint(cfg, 2, moved=0.1)
    make_checkpoint(cfg, 4, moved=0.1)
    return out


def trainer_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The weights of `checkpoint` loaded the way the trainer loads them."""
    cfg = tiny()
    model = load_policy(str(json.loads((checkpoint / "config.json").read_text())["model"]["path"]))
    core = TrainerCore(model, cfg.trainer, cfg.sampling, vocab_size=16, pad_id=0, total_steps=9)
    load_trainer_state(core, checkpoint / disk.TRAINER_DIR, sharded=False)
    return {n: t.detach().clone() for n, t in core.model.state_dict().items()}


def test_export_holds_the_checkpoints_weights_and_the_runs_sampling(
    run_dir: Path, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), str(out)]) == 0
    newest = run_dir / "checkpoints" / "step-000004"
    model = AutoModelForCausalLM.from_pretrained(out)
    got, want = model.state_dict(), trainer_weights(newest)
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want)
    base = load_policy(str(tiny_checkpoint)).state_dict()
    assert not any(torch.equal(got[n], base[n]) for n in base)  # not the base model's
    assert (out / "model.safetensors").is_file()
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["do_sample"], gen["temperature"], gen["top_p"], gen["top_k"]) == (
        True,
        0.7,
        1.0,
        0,
    )
    assert gen["max_new_tokens"] == 8
    info = read_export_info(out)
    assert info is not None
    assert (info.version, info.checkpoint) == (4, str(newest.resolve()))
    assert info.config.sampling.temperature == 0.7
    # Readable by others, as the files a user writes are (not transformers' owner-only).
    assert all(f.stat().st_mode & stat.S_IROTH for f in out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]  # no leftovers


def test_an_older_checkpoint_exports_its_own_weights(run_dir: Path, tmp_path: Path) -> None:
    older = run_dir / "checkpoints" / "step-000002"
    policy = export(older, tmp_path / "v2")
    assert policy.version == 2
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "v2").state_dict()
    want = trainer_weights(older)
    assert all(torch.equal(got[n], want[n]) for n in want)
    newer = trainer_weights(run_dir / "checkpoints" / "step-000004")
    assert not any(torch.equal(got[n], newer[n]) for n in newer)


def test_force_replaces_what_the_out_dir_held(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    out.mkdir()
    (out / "stale.txt").write_text("from before")
    assert main(["export", str(run_dir / "checkpoints"), str(out), "--force"]) == 0
    assert not (out / "stale.txt").exists()
    assert (out / EXPORT_FILE).is_file()
    assert main(["export", str(run_dir), str(tmp_path / "empty-is-fine")]) == 0


def refused(args: list[str], root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs `export ARGS`, expects one error line and exit status 2, and that nothing below
    `root` changed; returns the line."""
    before = tree(root)
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo export: error: "), err
    assert err.count("\n") == 1, err
    assert tree(root) == before
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    return err


def test_bad_sources_are_refused(
    run_dir: Path, tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    ckpts = run_dir / "checkpoints"
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "fresh-run").mkdir()
    shutil.copy(ckpts / "step-000004" / "config.json", tmp_path / "fresh-run")
    cases = [
        ([str(tmp_path / "nowhere"), out], "does not exist"),
        ([str(tmp_path / "file.txt"), out], "is a file, not a run directory or a checkpoint"),
        ([str(tmp_path / "empty"), out], "is not a run directory or a checkpoint"),
        ([str(tiny_checkpoint), out], "(a model directory already: `async-grpo eval`"),
        ([str(tmp_path / "fresh-run"), out], "(a run's output directory that holds no checkpoint"),
        ([str(run_dir)], "expected RUN_DIR_OR_CHECKPOINT OUT_DIR, got 1 argument"),
        ([str(run_dir), out, "--dtype", "bf16"], "unknown option '--dtype'"),
    ]
    for args, message in cases:
        assert message in refused(args, tmp_path, capsys), args
    # Incomplete: its manifest is missing (an interrupted write), given directly or as the
    # newest of a run.
    (ckpts / "step-000004" / disk.MANIFEST).unlink()
    message = "step-000004 is incomplete: it has no manifest.json"
    assert message in refused([str(ckpts / "step-000004"), out], tmp_path, capsys)
    # Damaged: a file shorter, or changed, than its manifest says.
    weights = next((ckpts / "step-000002" / disk.TRAINER_DIR).glob("*.distcp"))
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    assert "(truncated)" in refused([str(run_dir), out], tmp_path, capsys)
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "(corrupted)" in refused([str(run_dir), out], tmp_path, capsys)
    shutil.rmtree(ckpts / "step-000002")
    assert "holds no complete checkpoint" in refused([str(run_dir), out], tmp_path, capsys)


def test_bad_destinations_are_refused(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(run_dir)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("x")
    newest = run_dir / "checkpoints" / "step-000004"
    cases = [
        ([src, str(full)], "exists and is not empty; give --force to replace it"),
        ([src, str(tmp_path / "file.txt"), "--force"], "exists and is not a directory"),
        ([src, str(newest / "model")], "is inside the checkpoint"),
        ([src, str(run_dir), "--force"], "holds the checkpoint"),
        ([src, str(tmp_path), "--force"], "holds the checkpoint"),
    ]
    for args, message in cases:
        assert message in refused(args, tmp_path, capsys), args


def test_a_missing_base_model_is_refused(
    run_dir: Path, tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = tmp_path / "moved-away"
    tiny_checkpoint.rename(moved)
    try:
        err = refused([str(run_dir), str(tmp_path / "out")], tmp_path, capsys)
    finally:
        moved.rename(tiny_checkpoint)
    assert f"the run's base model (model.path '{tiny_checkpoint}')" in err


def test_help_says_how_to_load_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert "RUN_DIR_OR_CHECKPOINT OUT_DIR [--force] [--adapter-only]" in out
    assert "PeftModel.from_pretrained" in out
    assert "AutoModelForCausalLM.from_pretrained" in out


def test_a_base_model_the_weights_do_not_fit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = corpus_for("count", 1, 6)
    base = write_random_checkpoint(tmp_path / "base", TINY_ARCH, corpus, seed=0)
    cfg = apply_overrides(tiny(), {"model.path": str(base), "out_dir": str(tmp_path / "run")})
    make_checkpoint(cfg, 2)
    shutil.rmtree(base)  # replaced by a model of another width
    write_random_checkpoint(base, dataclasses.replace(TINY_ARCH, hidden_size=64), corpus, seed=0)
    err = refused([str(tmp_path / "run"), str(tmp_path / "out")], tmp_path, capsys)
    assert "do not fit the base model" in err
    assert (
        "Size mismatch between saved torch.Size([12, 128]) and current: torch.Size([12, 64])" in err
    )


LORA = {
    "trainer.lora.rank": "4",
    "trainer.lora.alpha": "8",
    "trainer.lora.target_modules": "q_proj,down_proj",
}


@pytest.fixture
def lora_run(tmp_path: Path, tiny_checkpoint: Path) -> Path:
    """A LoRA run's directory holding checkpoint 3, its adapters moved off zero."""
    out = tmp_path / "lora-run"
    cfg = apply_overrides(tiny(), {**LORA, "model.path": str(tiny_checkpoint), "out_dir": str(out)})
    make_checkpoint(cfg, 3, moved=0.2)
    return out


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=torch.tensor([[3, 4, 5, 6, 7]])).logits
    return out


def test_a_lora_run_exports_merged_or_as_its_adapter(
    lora_run: Path, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", str(lora_run), str(merged_dir)]) == 0
    assert main(["export", str(lora_run), str(adapter_dir), "--adapter-only"]) == 0
    # Merged: a plain Qwen2 that transformers loads alone, no adapter left in it.
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert not any("lora" in n for n in merged.state_dict())
    base = load_policy(str(tiny_checkpoint))
    assert not torch.equal(logits(merged), logits(base))
    # The adapter: megabytes rather than the model, put back onto the base by peft.
    names = {p.name for p in adapter_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "generation_config.json"} <= names
    assert "model.safetensors" not in names
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_checkpoint.resolve())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    adapted = PeftModel.from_pretrained(load_policy(str(tiny_checkpoint)), str(adapter_dir))
    torch.testing.assert_close(logits(adapted), logits(merged), atol=1e-5, rtol=1e-5)
    info = read_export_info(adapter_dir)
    assert info is not None
    assert (info.adapter_only, info.version) == (True, 3)
    merged_info = read_export_info(merged_dir)
    assert merged_info is not None
    assert not merged_info.adapter_only
    assert merged_info.config.trainer.lora.rank == 4


def test_eval_scores_an_adapter_as_its_merged_export(lora_run: Path, tmp_path: Path) -> None:
    export(lora_run, tmp_path / "merged")
    export(lora_run, tmp_path / "adapter", adapter_only=True)
    scores = []
    for name in ("merged", "adapter"):
        json_path = tmp_path / f"{name}.json"
        assert main(["eval", str(tmp_path / name), "--samples", "2", "--json", str(json_path)]) == 0
        scores.append(json.loads(json_path.read_text())["rows"])
    assert scores[0] == scores[1]


def test_adapter_only_is_refused_for_a_full_fine_tune(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused([str(run_dir), str(tmp_path / "out"), "--adapter-only"], tmp_path, capsys)
    assert "trained every weight (trainer.lora.rank 0)" in err
    assert "leave out --adapter-only" in err
