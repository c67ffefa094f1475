"""A checkpoint written by a sharded trainer (`--trainer.procs 2`: every parameter a `Shard(0)`
DTensor, each rank writing its shards) exports to the whole weights it holds.

A real run with a 2-rank FSDP trainer writes the checkpoint; the weights it holds are read
back independently of the export's loader, by `torch.distributed.checkpoint`'s own
consolidation (`dcp_to_torch_save`), and by a one-process trainer loading it the way a
resumed run does.
"""

import asyncio
from pathlib import Path

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.export import export
from async_grpo.checkpoint.trainer_state import load_trainer_state
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import load_policy
from async_grpo.train import run
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

STEPS = 3


@pytest.mark.timeout(420)
def test_a_sharded_checkpoint_exports_the_weights_it_holds(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = apply_overrides(
        tiny(),
        {
            "trainer.procs": "2",
            "generator.replicas": "1",
            "mode": "sync",
            "steps": str(STEPS),
            "eval_every": "0",
            "trace": "false",
            "out_dir": str(out),
        },
    )
    summary = asyncio.run(run(cfg, quiet=True))
    assert summary.steps == STEPS
    checkpoint = disk.complete(out)[-1]
    assert disk.read_manifest(checkpoint).trainer_procs == 2

    policy = export(out, tmp_path / "exported")
    assert policy.version == STEPS
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()

    # What the checkpoint holds, consolidated by DCP itself from the two ranks' shards.
    dcp_to_torch_save(checkpoint / disk.TRAINER_DIR, tmp_path / "whole.pt")
    held = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    assert set(held) <= set(exported)
    for name, tensor in held.items():
        assert torch.equal(exported[name], tensor), name
    # Tied weights the checkpoint holds once are the same tensor in the export.
    for name in set(exported) - set(held):
        assert any(torch.equal(exported[name], t) for t in held.values()), name

    # The same weights as a one-process trainer restored from it (a resume with procs 1).
    core = TrainerCore(
        load_policy(policy.base), cfg.trainer, cfg.sampling, vocab_size=12, pad_id=0, total_steps=9
    )
    load_trainer_state(core, checkpoint / disk.TRAINER_DIR, sharded=False)
    assert core.version == STEPS
    restored = core.model.state_dict()
    assert all(torch.equal(exported[n], restored[n]) for n in restored)
    base = load_policy(policy.base).state_dict()
    assert any(not torch.equal(exported[n], base[n]) for n in base)  # it trained
