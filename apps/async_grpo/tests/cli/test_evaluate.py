"""`async-grpo eval`: a model scored in this process with the run's evaluation code, and every
bad input refused with one line, exit status 2 and nothing written.

A real tiny Qwen2 model directory written with `save_pretrained`, real checkpoints written
without Monarch (`made_checkpoints`) and their exports. That a run's checkpoint scores what
the run itself recorded: `tests/runs/test_export_eval.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.export import export
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.generation.decoding import generate
from async_grpo.model.policy import load_policy, load_tokenizer
from async_grpo.observability.scoring import eval_seed, pass_at_k
from async_grpo.tasks.rewards import count_score
from made_checkpoints import make_checkpoint, tree
from transformers import AutoModelForCausalLM

COUNT_PROMPTS = [f"count to {n}:" for n in range(1, 7)]


def evaluated(args: list[str], json_path: Path) -> dict[str, Any]:
    assert main(["eval", *args, "--json", str(json_path)]) == 0
    numbers: dict[str, Any] = json.loads(json_path.read_text())
    return numbers


def test_scores_every_prompt_with_the_runs_seeded_samples(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    numbers = evaluated([str(tiny_checkpoint), "--samples", "4", "--seed", "3"], tmp_path / "e")
    rows = numbers["rows"]
    assert [r["prompt"] for r in rows] == COUNT_PROMPTS  # the tiny preset's eval set
    assert (numbers["version"], numbers["samples"], numbers["prompts"]) == (0, 4, 6)
    # The answers are those the run's generator samples for the evaluation after step 0 of
    # a run seeded 3: the whole set in one batch, from the seed `eval_seed` gives.
    sampling = apply_overrides(tiny(), {"sampling.group_size": "4"}).sampling
    groups = generate(
        load_policy(str(tiny_checkpoint)),
        load_tokenizer(str(tiny_checkpoint)),
        COUNT_PROMPTS,
        sampling,
        0,
        generator=torch.Generator().manual_seed(eval_seed(3, 0)),
    )
    assert [r["answers"] for r in rows] == [[c.text for c in g] for g in groups]
    for r in rows:
        assert r["rewards"] == [count_score(a, r["target"]) for a in r["answers"]]
        assert r["reward"] == pytest.approx(sum(r["rewards"]) / 4)
        correct = sum(x >= 1.0 for x in r["rewards"])
        assert r["correct"] == correct
        assert r["pass_at"] == {"1": correct / 4, "4": pass_at_k(4, correct, 4)}
    assert numbers["mean_reward"] == pytest.approx(sum(r["reward"] for r in rows) / 6)
    assert numbers["pass_at"]["1"] == pytest.approx(sum(r["correct"] / 4 for r in rows) / 6)
    out = capsys.readouterr().out
    assert f"mean reward {numbers['mean_reward']:.3f}" in out
    assert out.count("'count to") == 6  # a line per prompt


def test_a_lower_bar_counts_more_answers_correct(tiny_checkpoint: Path, tmp_path: Path) -> None:
    numbers = evaluated(
        [str(tiny_checkpoint), "--samples", "4", "--correct_at", "0.1"], tmp_path / "e"
    )
    for r in numbers["rows"]:
        assert r["correct"] == sum(x >= 0.1 for x in r["rewards"])
    assert numbers["correct_at"] == 0.1


def test_greedy_answers_are_transformers_greedy_ones(tiny_checkpoint: Path, tmp_path: Path) -> None:
    numbers = evaluated([str(tiny_checkpoint), "--greedy"], tmp_path / "e")
    assert numbers["samples"] == 1
    assert list(numbers["pass_at"]) == ["1"]
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    tok = load_tokenizer(str(tiny_checkpoint))
    for row in numbers["rows"]:
        ids = tok(row["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
        generated = model.generate(ids, do_sample=False, max_new_tokens=8)  # type: ignore[misc]
        out = generated[0, ids.shape[1] :].tolist()
        if tok.eos_token_id in out:
            out = out[: out.index(tok.eos_token_id)]
        assert row["answers"] == [tok.decode(out)], row["prompt"]


def test_batches_are_seeded_apart_and_repeat(tiny_checkpoint: Path, tmp_path: Path) -> None:
    args = [str(tiny_checkpoint), "--samples", "4", "--batch_prompts", "2"]
    a, b = evaluated(args, tmp_path / "a"), evaluated(args, tmp_path / "b")
    assert a["rows"] == b["rows"]
    assert len(a["rows"]) == 6


def test_a_dataset_given_here_is_scored_whole(tiny_checkpoint: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    lines = [{"prompt": f"count to {1 + k % 6}:", "target": "1"} for k in range(10)]
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    base = [str(tiny_checkpoint), "--samples", "2", "--data.path", str(data)]
    assert len(evaluated(base, tmp_path / "a")["rows"]) == 10  # the preset's eval_prompts is 8
    assert len(evaluated([*base, "--eval_prompts", "3"], tmp_path / "b")["rows"]) == 3


def test_a_checkpoint_and_its_export_score_alike(tiny_checkpoint: Path, tmp_path: Path) -> None:
    cfg = apply_overrides(
        tiny(), {"model.path": str(tiny_checkpoint), "out_dir": str(tmp_path / "run")}
    )
    checkpoint = make_checkpoint(cfg, 5, moved=0.2)
    export(checkpoint, tmp_path / "exported")
    a = evaluated([str(tmp_path / "run"), "--samples", "4"], tmp_path / "a.json")
    b = evaluated([str(tmp_path / "exported"), "--samples", "4"], tmp_path / "b.json")
    assert (a["version"], b["version"]) == (5, 5)  # the same seeds: those of the step-5 eval
    assert a["rows"] == b["rows"]
    base = evaluated([str(tiny_checkpoint), "--samples", "4", "--seed", "0"], tmp_path / "c")
    assert base["rows"] != a["rows"]


def refused(args: list[str], root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = tree(root)
    assert main(["eval", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("async-grpo eval: error: "), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    assert tree(root) == before
    return captured.err


def test_bad_input_is_one_line_and_writes_nothing(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_checkpoint)
    json_out = str(tmp_path / "eval.json")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        ([], "give the model first"),
        (["--samples", "4", model], "give the model first"),
        ([str(tmp_path / "nowhere")], "does not exist, and is not a hub id in the local"),
        ([str(tmp_path / "file.txt")], "is a file, not a model directory"),
        ([str(tmp_path / "empty")], "is not a model directory (no config.json)"),
        ([model, "--samples", "0"], "--samples must be >= 1"),
        ([model, "--samples", "many"], "--samples: expected an integer >= 1, got 'many'"),
        ([model, "--greedy", "--samples", "4"], "--greedy gives one answer per prompt"),
        ([model, "--greedy", "maybe"], "--greedy: expected true or false, got 'maybe'"),
        ([model, "--correct_at", "nan"], "--correct_at must be a finite number"),
        ([model, "--batch_prompts", "0"], "--batch_prompts must be >= 1"),
        ([model, "--trainer.lr", "1e-3"], "trainer.lr: eval does not use it"),
        ([model, "--sampling.tempreature", "1"], "unknown config key 'sampling.tempreature'"),
        ([model, "--sampling.temperature", "0"], "sampling.temperature must be > 0"),
        ([model, "--reward.fns", "nope"], "reward.fns: unknown reward function"),
        ([model, "--data.path", str(tmp_path / "no.jsonl")], "data.path: dataset file not found"),
        ([model, "--json", str(tmp_path / "no" / "e.json")], "is not a writable directory"),
        ([model, "--json", str(tmp_path)], "is a directory"),
        ([model, "--preset", "huge"], "--preset: unknown preset 'huge'"),
        ([model, "stray"], "unexpected argument 'stray'"),
    ]
    if not torch.cuda.is_available():
        cases.append(([model, "--device", "cuda"], "device cuda: torch sees no GPU here"))
    for args, message in cases:
        given = args if "--json" in args else [*args, "--json", json_out]
        assert message in refused(given, tmp_path, capsys), args


def test_bad_checkpoints_are_refused(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = apply_overrides(tiny(), {"model.path": str(tiny_checkpoint), "out_dir": str(run)})
    checkpoint = make_checkpoint(cfg, 2)
    err = refused([str(run), "--preset", "tiny"], tmp_path, capsys)
    assert "--preset: the run's config gives the defaults" in err
    env_cfg = apply_overrides(cfg, {"env.tasks": "repeat", "out_dir": str(tmp_path / "env-run")})
    make_checkpoint(env_cfg, 2)
    err = refused([str(tmp_path / "env-run")], tmp_path, capsys)
    assert "the run trained on environments (env.tasks 'repeat')" in err
    # Given a task (even the default one), it scores that.
    numbers = evaluated(
        [str(tmp_path / "env-run"), "--data.task", "count", "--samples", "2"], tmp_path / "e"
    )
    assert len(numbers["rows"]) == 6
    (tmp_path / "e").unlink()
    capsys.readouterr()
    weights = next((checkpoint / disk.TRAINER_DIR).glob("*.distcp"))
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "(truncated)" in refused([str(run)], tmp_path, capsys)
    shutil.rmtree(checkpoint)
    assert "holds no complete checkpoint" in refused([str(run)], tmp_path, capsys)


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--samples K", "--greedy", "--correct_at R", "--json PATH", "pass@k"):
        assert option in out
