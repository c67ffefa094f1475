"""The vLLM engine in a real generator replica (a Monarch process): the sampled distribution
and its log-probs, in-place weight updates under concurrent generation, processes, bad input.

Needs vLLM (`uv sync --extra vllm`; the nox session `vllm` runs this module); skipped
without it. One engine per module: starting one takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]
import pytest
import torch
from actor_service import FaultFilter
from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.generator import Generator
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import TINY_ARCH, tiny
from async_grpo.config.schema import GeneratorConfig, ModelConfig, SamplingConfig
from async_grpo.controller.broadcast import sync_weights
from async_grpo.controller.ledger import PromptLedger
from async_grpo.controller.rollout import rollout_prompts
from async_grpo.generation.decoding import Completion
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import shutdown, spawn_components
from async_grpo.model.policy import load_policy, load_tokenizer, write_random_checkpoint
from async_grpo.observability.metrics import RunMetrics
from dtensor_reshard import ShardedManifest
from jobs import Parts
from monarch.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host
from rdma_tensor import Publisher

if os.environ.get("ASYNC_GRPO_REQUIRE_VLLM") == "1":  # the nox session: fail, never skip
    importlib.import_module("vllm")
else:
    pytest.importorskip("vllm", reason="needs vLLM: uv sync --extra vllm")

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=6, temperature=0.7, top_p=0.9)
# Longer than a KV-cache block (32 tokens here), so the prefix cache keeps its first block
# between calls: a stale one after a weight update would change its log-probs.
LONG = "count to 6 : " + "1 2 3 4 5 6 " * 6 + ":"
PROMPTS = ["count to 1 :", "count to 3 : 1 2", LONG]
UNKNOWN_ARCH = "CountingMachineForCausalLM"
# A stop that passed Monarch's 3 s cleanup deadline on a busy machine: deliberate too.
CLEANUP_OVERRAN = "cleanup error: deadline has elapsed"
# The SIGKILLed replica is reported either as killed or, when Monarch's poll asks its dead
# process's agent first, as a query left unanswered ("... The process likely crashed").
KILLED = "Killed(sig=9)"
KILLED_UNANSWERED = "The process likely crashed"


class Probe(Actor):
    """Beside the generator in its process: reports the process and its descendants."""

    @endpoint
    def pids(self) -> tuple[int, list[int]]:
        return os.getpid(), descendants(os.getpid())


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, grandchildren, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, pp in parents.items() if pp in frontier]
        found += children
        frontier = children
    return found


def still_alive(pids: list[int], within: float) -> list[int]:
    """Those of `pids` still running after waiting up to `within` seconds for them to go."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# The probe is spawned in a replica's process, which cannot import this module (its helpers,
# `jobs`, are on sys.path only here): cloudpickle ships the class itself.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="session", autouse=True)
def _tolerate_deliberate_kills() -> None:
    """Monarch reports the SIGKILLed replica (and the one refused at start) to the
    controller seconds later, and a stop can pass Monarch's cleanup deadline on a busy
    machine; the default hook would then exit pytest, which Monarch does by raising
    KeyboardInterrupt in the main thread (an xdist worker crashes, or a run in progress
    takes it for Ctrl-C). Every other failure still goes to the default hook, and Monarch
    writes its report to stderr. Never removed: the report can arrive after this module's
    last test, during the next file's in the same worker."""
    FaultFilter("a deliberate kill or stop", _deliberate).install()


def _deliberate(failure: MeshFailure) -> bool:
    text = str(failure)
    return any(m in text for m in (KILLED, KILLED_UNANSWERED, UNKNOWN_ARCH, CLEANUP_OVERRAN))


def vllm_config(kv_cache_gib: float = 0.0625) -> GeneratorConfig:
    return GeneratorConfig(replicas=1, engine="vllm", kv_cache_gib=kv_cache_gib, kv_block_tokens=32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The tiny preset's architecture: vLLM's CPU attention needs a head size of 32 or more.
    path = tmp_path_factory.mktemp("tiny-vllm")
    words = [f"count to {n} : " + " ".join(str(i) for i in range(1, n + 1)) for n in range(1, 7)]
    return write_random_checkpoint(path, TINY_ARCH, words, seed=0)


@pytest.fixture(scope="module")
def replica(checkpoint: Path) -> Iterator[tuple[ProcMesh, Generator]]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    model = ModelConfig(dtype="float32")
    gen = procs.spawn("generator", Generator, str(checkpoint), model, SAMPLING, 0, vllm_config())
    yield procs, gen
    with contextlib.suppress(Exception):  # the last test stops it itself
        procs.stop().get()


def recomputed(
    checkpoint: Path, weights: dict[str, torch.Tensor] | None, groups: list[list[Completion]]
) -> torch.Tensor:
    """The trainer's log-probs of `groups` (through `sequence_logprobs`) minus the behavior
    log-probs the generator recorded, at every response token."""
    model = load_policy(str(checkpoint))
    if weights is not None:
        model.load_state_dict(weights)
    tok = load_tokenizer(str(checkpoint))
    episodes = to_episodes(groups, [0.0] * sum(map(len, groups)), itertools.count())
    batch = pack(episodes, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch, SAMPLING.temperature, SAMPLING.top_p, len(tok))
    mask = batch.response_mask.bool()
    return (lp - batch.behavior_logprobs)[mask]


async def test_samples_the_configured_distribution(
    checkpoint: Path, replica: tuple[ProcMesh, Generator]
) -> None:
    _, gen = replica
    groups = await gen.generate.call_one(PROMPTS)
    tok = load_tokenizer(str(checkpoint))
    assert [len(g) for g in groups] == [SAMPLING.group_size] * len(PROMPTS)
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            assert c.prompt == prompt
            assert c.prompt_ids == tok(prompt, add_special_tokens=False)["input_ids"]
            assert 1 <= len(c.response_ids) <= SAMPLING.max_new_tokens
            assert len(c.behavior_logprobs) == len(c.response_ids)
            assert c.finished == (c.response_ids[-1] == tok.eos_token_id)
            assert tok.eos_token_id not in c.response_ids[:-1]
            assert c.policy_version == 0
    # At equal weights the trainer's recomputation gives the recorded log-probs.
    diff = recomputed(checkpoint, None, groups)
    assert diff.numel() > 0
    assert diff.abs().max().item() <= 1e-4, diff.abs().max().item()


async def test_continues_multi_turn_contexts(
    checkpoint: Path, replica: tuple[ProcMesh, Generator]
) -> None:
    # One completion per context of token ids (multi-turn conversations so far), whose
    # log-probs the trainer's recomputation reproduces.
    _, gen = replica
    tok = load_tokenizer(str(checkpoint))
    contexts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    contexts[0] = contexts[0] + [tok.eos_token_id] + contexts[-1]  # an earlier turn's end
    turns = await gen.continue_turns.call_one(contexts)
    assert len(turns) == len(contexts)
    for context, c in zip(contexts, turns, strict=True):
        assert c.prompt_ids == context
        assert c.prompt == ""
        assert 1 <= len(c.response_ids) <= SAMPLING.max_new_tokens
        assert len(c.behavior_logprobs) == len(c.response_ids)
    diff = recomputed(checkpoint, None, [[c] for c in turns])
    assert diff.abs().max().item() <= 1e-4, diff.abs().max().item()


def perturbed(checkpoint: Path, version: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(version)
    state = load_policy(str(checkpoint)).state_dict()
    return {n: t + 0.3 * torch.randn_like(t) for n, t in state.items()}


async def test_updates_in_place_under_concurrent_generation(
    checkpoint: Path, replica: tuple[ProcMesh, Generator]
) -> None:
    _, gen = replica
    publisher = Publisher()
    versions = {v: perturbed(checkpoint, v) for v in (1, 2, 3)}
    results: list[list[list[Completion]]] = []

    async def keep_generating(stop: asyncio.Event) -> None:
        while not stop.is_set():
            results.append(await gen.generate.call_one(PROMPTS))

    stop = asyncio.Event()
    sampler = asyncio.create_task(keep_generating(stop))
    for v, state in versions.items():
        await asyncio.sleep(0.3)
        sync = await gen.update_weights.call_one(publisher.publish(state, v))
        assert sync.version == v
    await asyncio.sleep(0.3)
    stop.set()
    await sampler
    publisher.close()
    by_version: dict[int, list[list[Completion]]] = {}
    for groups in results:
        stamps = {c.policy_version for g in groups for c in g}
        assert len(stamps) == 1, stamps  # one call, one version
        by_version.setdefault(stamps.pop(), []).extend(groups)
    assert set(by_version) >= {1, 2, 3}, sorted(by_version)
    for v, groups in by_version.items():
        weights = versions.get(v)
        worst = recomputed(checkpoint, weights, groups).abs().max().item()
        assert worst <= 1e-4, (v, worst)  # sampled from exactly the stamped version
        # ... and from no other one (the check can tell versions apart).
        other = versions[v % 3 + 1]
        assert recomputed(checkpoint, other, groups).abs().max().item() > 1e-2


async def test_sigkill_leaves_no_process_behind(checkpoint: Path) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    model = ModelConfig(dtype="float32")
    gen = procs.spawn("generator", Generator, str(checkpoint), model, SAMPLING, 1, vllm_config())
    probe = procs.spawn("probe", Probe)
    assert len(await gen.generate.call_one(["count to 2 :"])) == 1
    pid, helpers = await probe.pids.call_one()
    os.kill(pid, signal.SIGKILL)
    # vLLM's engine runs inside the replica; what else runs below it (Python's
    # multiprocessing resource tracker) goes with it.
    assert still_alive([pid, *helpers], within=30.0) == []


def with_architecture(checkpoint: Path, dst: Path, architecture: str) -> Path:
    """A copy of `checkpoint` whose config.json names `architecture`."""
    dst.mkdir()
    for f in checkpoint.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["architectures"] = [architecture]
    (dst / "config.json").write_text(json.dumps(config))
    return dst


async def test_an_architecture_vllm_cannot_load_fails_at_spawn(
    checkpoint: Path, tmp_path: Path
) -> None:
    bad = with_architecture(checkpoint, tmp_path / "bad", UNKNOWN_ARCH)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        gen = procs.spawn(
            "generator", Generator, str(bad), ModelConfig(), SAMPLING, 0, vllm_config()
        )
        with pytest.raises(Exception, match=f"architecture {UNKNOWN_ARCH} is not one it supports"):
            await gen.generate.call_one(["count to 1 :"])
    finally:
        await procs.stop()


async def test_stopping_the_replica_stops_everything(
    replica: tuple[ProcMesh, Generator],
) -> None:
    # After every other test of the module's replica: it stops it.
    procs, _ = replica
    probe = procs.spawn("probe", Probe)
    pid, helpers = await probe.pids.call_one()
    await procs.stop()
    assert still_alive([pid, *helpers], within=30.0) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_cuda_engine_samples_and_updates_with_tensor_parallel(checkpoint: Path) -> None:
    # Never run yet (no GPU where this was written): the same path on CUDA, bf16, split over
    # up to two GPUs when there are two.
    tp = 2 if torch.cuda.device_count() >= 2 else 1
    cfg = GeneratorConfig(replicas=1, engine="vllm", kv_cache_gib=0.5, tensor_parallel=tp)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        model = ModelConfig(dtype="bfloat16")
        gen = procs.spawn("generator", Generator, str(checkpoint), model, SAMPLING, 0, cfg)
        groups = await gen.generate.call_one(PROMPTS)
        assert recomputed(checkpoint, None, groups).abs().max().item() <= 0.1
        publisher = Publisher()
        state = perturbed(checkpoint, 1)
        assert (await gen.update_weights.call_one(publisher.publish(state, 1))).version == 1
        groups = await gen.generate.call_one(PROMPTS)
        assert {c.policy_version for g in groups for c in g} == {1}
        assert recomputed(checkpoint, state, groups).abs().max().item() <= 0.1
        publisher.close()
    finally:
        await procs.stop()


def test_sharded_trainer_weights_reach_the_vllm_engine(tmp_path: Path) -> None:
    # A 2-rank FSDP trainer publishes through dtensor-reshard; the vLLM replica pulls the
    # slices into CPU staging and reloads them. The next completions are stamped with the
    # new version and their log-probs are the trainer's new weights'.
    overrides = {
        "trainer.procs": "2",
        "generator.replicas": "1",
        "generator.engine": "vllm",
        "generator.kv_cache_gib": "0.0625",
        "model.dtype": "float32",
        "mode": "sync",
        "out_dir": str(tmp_path),
    }
    cfg = apply_overrides(tiny(), overrides)
    prep = prepare(cfg)

    async def main() -> None:
        c = await spawn_components(cfg, prep, print)
        try:
            ledger = PromptLedger(cfg.seed, cfg.generator.prompts_per_call, None)
            batch = None
            while batch is None:
                call = ledger.claim(0)
                assert call is not None
                await rollout_prompts(Parts(cfg, c, ledger, RunMetrics(cfg.window)), call)
                batch = await c.buffer.endpoint(BufferActor.sample).route(0, cfg.trainer.batch_size)
            result = await c.trainer.train_step(list(batch.episodes), None)
            assert isinstance(result.weights, ShardedManifest)
            assert (await sync_weights(c, result.weights)).version == 1
            groups = await c.generator.endpoint(Generator.generate).route(PROMPTS[:2])
            assert {x.policy_version for g in groups for x in g} == {1}
            weights = await c.trainer.full_weights()
            model = load_policy(prep.model_path)
            model.load_state_dict(weights, strict=False)  # a tied head is one parameter
            tok = load_tokenizer(prep.model_path)
            episodes = to_episodes(groups, [0.0] * sum(map(len, groups)), itertools.count())
            packed = pack(episodes, pad_id=tok.pad_token_id)
            s = cfg.sampling
            with torch.no_grad():
                lp = sequence_logprobs(model, packed, s.temperature, s.top_p, len(tok))
            diff = (lp - packed.behavior_logprobs)[packed.response_mask.bool()]
            assert diff.abs().max().item() <= 1e-4, diff.abs().max().item()
        finally:
            await shutdown(c)

    asyncio.run(main())
