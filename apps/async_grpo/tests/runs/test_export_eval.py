"""From a run to a model you can use: the tiny preset trained, then `async-grpo eval`, then
`async-grpo export`, then the export loaded with `transformers` and generating.

One real run per entry of `RUNS` (module-scoped: every test reads the same run), real
checkpoints written by it, the commands run as the command line runs them. `eval` of the
run's checkpoint must score exactly what the run recorded for the same weights (the two share
one code path), and the export must hold exactly the weights the trainer's checkpoint holds.

The full run is the fixed-seed CI run, the default async loop on one host: it must learn
(`test_the_fixed_seed_ci_run_learns`); sharing it spares the suite a run of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.export import read_export_info
from async_grpo.checkpoint.trainer_state import load_trainer_state
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import RunConfig
from async_grpo.generation.decoding import generate
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.lora import add_adapters
from async_grpo.model.policy import built_checkpoint, load_policy, load_tokenizer
from async_grpo.observability.console import Summary
from async_grpo.train import run
from jobs import unaccounted
from transformers import AutoModelForCausalLM, PreTrainedModel

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

RUNS: dict[str, dict[str, str]] = {
    # The default async loop, fixed seed; its evaluations and checkpoints every 40 steps.
    "full": {"steps": "120", "seed": "0", "max_minutes": "10", "checkpoint.every": "40"},
    # The README's LoRA settings for the tiny preset: its frozen tied head needs the lower
    # temperature to make one token much likelier than the others.
    "lora": {
        **{"steps": "60", "eval_every": "30", "checkpoint.every": "30"},
        **{"trainer.lora.rank": "8", "trainer.lr": "3e-3", "sampling.temperature": "0.3"},
    },
}
"""The runs walked through, by name: overrides of the tiny preset (`--key value` as a dict).
Every test checks each run; a LoRA run's export is its base with the adapters merged in."""


@dataclasses.dataclass(frozen=True)
class Trained:
    """A finished run: its config, its summary (every evaluation it made) and its directory."""

    cfg: RunConfig
    summary: Summary
    out_dir: Path
    overrides: dict[str, str]

    @property
    def eval_flags(self) -> list[str]:
        """The run's overrides that `eval` reads (its sampling), as command-line flags, for
        `eval` of a model from elsewhere with the run's settings."""
        read = {k: v for k, v in self.overrides.items() if k.startswith("sampling.")}
        return [a for key, value in read.items() for a in (f"--{key}", value)]

    @property
    def base(self) -> Path:
        """The random checkpoint the run built and trained from."""
        return built_checkpoint(self.out_dir, self.cfg.model.arch, self.cfg.model.init_seed)


def train(name: str, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    out = tmp_path_factory.mktemp(f"run-{name}")
    cfg = apply_overrides(tiny(), {**RUNS[name], "out_dir": str(out)})
    summary = asyncio.run(run(cfg, quiet=True))
    assert summary.steps == cfg.steps  # finished within the time limit
    return Trained(cfg, summary, out, RUNS[name])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train("full", tmp_path_factory)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train("lora", tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(RUNS))
def trained(request: pytest.FixtureRequest) -> Trained:
    chosen: Trained = request.getfixturevalue(f"{request.param}_run")
    return chosen


def test_the_fixed_seed_ci_run_learns(full_run: Trained) -> None:
    cfg, summary = full_run.cfg, full_run.summary
    rows = [json.loads(line) for line in (full_run.out_dir / "metrics.jsonl").open()]
    assert rows[-1]["version"] >= cfg.steps
    assert summary.reward_start <= 0.3
    assert summary.reward_end - summary.reward_start >= 0.3, summary
    # The evaluation (every N, 16 samples each, from the initial weights on) rises too: the
    # policy, not the prompt mix.
    assert summary.eval_start is not None
    assert summary.eval_end is not None
    assert summary.eval_end - summary.eval_start >= 0.3, summary
    assert all(r["staleness_mean"] <= cfg.buffer.max_policy_age for r in rows)
    # Every generated episode is accounted for at every step, and the admission window
    # keeps what is generated trainable: little goes stale.
    assert [unaccounted(r) for r in rows] == [0] * len(rows)
    assert rows[-1]["episodes_trained"] >= 0.9 * rows[-1]["episodes_generated"], rows[-1]


@pytest.fixture(scope="module")
def exported(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "model"
    assert main(["export", str(trained.out_dir), str(out)]) == 0
    return out


def evaluated(args: list[str], json_path: Path) -> dict[str, Any]:
    assert main(["eval", *args, "--json", str(json_path)]) == 0
    numbers: dict[str, Any] = json.loads(json_path.read_text())
    return numbers


def trainer_model(trained: Trained) -> PreTrainedModel:
    """The policy of the run's newest checkpoint, loaded the way the trainer loads it (a LoRA
    run's adapters unmerged, as the trainer ran them)."""
    checkpoint = disk.complete(trained.out_dir)[-1]
    model = load_policy(str(trained.base))
    if trained.cfg.trainer.lora.enabled:
        add_adapters(model, trained.cfg.trainer.lora)
    core = TrainerCore(
        model, trained.cfg.trainer, trained.cfg.sampling, vocab_size=12, pad_id=0, total_steps=9
    )
    load_trainer_state(core, checkpoint / disk.TRAINER_DIR, sharded=False)
    assert core.version == trained.cfg.steps
    return model


def new_tokens(model: Any, ids: torch.Tensor, **kwargs: Any) -> list[int]:
    """`transformers`' `generate` on one prompt: the ids it appended."""
    return [int(t) for t in model.generate(ids, **kwargs)[0, ids.shape[1] :]]


def test_eval_scores_what_the_run_recorded(trained: Trained, tmp_path: Path) -> None:
    evals = trained.summary.metrics.evals
    first, last = evals[0], evals[-1]
    assert (first.step, first.version) == (0, 0)
    steps = trained.cfg.steps
    assert (last.step, last.version) == (steps, steps)  # the final weights, after the run
    after = evaluated([str(trained.out_dir)], tmp_path / "after.json")
    before = evaluated([str(trained.base), *trained.eval_flags], tmp_path / "before.json")
    # The same prompts, seeds, sampling and scoring as the run's own evaluation of the same
    # weights: the same numbers, to the bit.
    for numbers, recorded in ((after, last), (before, first)):
        assert numbers["mean_reward"] == recorded.reward
        assert numbers["exact"] == recorded.exact
        assert [(r["prompt"], r["reward"]) for r in numbers["rows"]] == list(recorded.per_prompt)
    assert after["version"] == steps
    assert after["mean_reward"] - before["mean_reward"] >= 0.15, (before, after)
    print(
        f"tiny preset {trained.overrides}: "
        f"mean reward {before['mean_reward']:.3f} -> "
        f"{after['mean_reward']:.3f}, pass@1 {before['pass_at']['1']:.3f} -> "
        f"{after['pass_at']['1']:.3f}, pass@16 {before['pass_at']['16']:.3f} -> "
        f"{after['pass_at']['16']:.3f}"
    )


def test_the_export_holds_the_trainers_weights(trained: Trained, exported: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(exported)
    trainer = trainer_model(trained)
    got = model.state_dict()
    if trained.cfg.trainer.lora.enabled:
        # Merged: a plain model whose outputs are the trainer's base + adapter, to rounding.
        assert not any("lora" in n for n in got)
        assert set(got) == set(load_policy(str(trained.base)).state_dict())
        ids = torch.arange(3, 11).unsqueeze(0)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, trainer(ids).logits, atol=1e-5, rtol=0)
    else:
        want = trainer.state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(got[n], want[n]) for n in want)
    info = read_export_info(exported)
    assert info is not None
    assert info.version == trained.cfg.steps
    assert info.checkpoint == str(disk.complete(trained.out_dir)[-1].resolve())


def test_greedy_generations_of_the_export_are_the_trainers(
    trained: Trained, exported: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(exported)
    trainer = trainer_model(trained)
    tok = load_tokenizer(str(exported))
    prompts = [f"count to {n}:" for n in range(1, 7)]
    # The app's own greedy decoding on the trainer's weights ...
    sampling = dataclasses.replace(trained.cfg.sampling, group_size=1)
    ours = generate(trainer, tok, prompts, sampling, trained.cfg.steps, greedy=True)
    longest = sampling.max_new_tokens
    for prompt, (completion,) in zip(prompts, ours, strict=True):
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        # ... is transformers' greedy decoding of the export, and of the trainer's weights.
        for m in (model, trainer):
            out = new_tokens(m, ids, do_sample=False, max_new_tokens=longest)
            assert out == completion.response_ids, prompt
    # Without arguments, `generate` samples the run's distribution (the generation config).
    ids = tok("count to 3:", return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert model.generation_config.do_sample
    assert 1 <= len(new_tokens(model, ids)) <= longest
    print("greedy answers of the export:", [c.text for (c,) in ours])


def test_the_export_scores_as_its_checkpoint(
    trained: Trained, exported: Path, tmp_path: Path
) -> None:
    of_export = evaluated([str(exported), "--samples", "8"], tmp_path / "export.json")
    of_run = evaluated([str(trained.out_dir), "--samples", "8"], tmp_path / "run.json")
    assert of_export["version"] == of_run["version"] == trained.cfg.steps
    assert of_export["rows"] == of_run["rows"]
    assert of_export["pass_at"] == of_run["pass_at"]
