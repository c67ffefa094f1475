"""How much a train step slows down while another process works beside it, on this machine.

Async RL overlaps the trainer with the generator; the overlap pays only if the two really
run side by side. On a machine whose cores share their execution units (SMT siblings, or
vCPUs a hypervisor backs with them), the trainer's step grows while the generator samples,
and that growth, not the scheduling, bounds what async can gain over sync.

    uv run python apps/async_grpo/benchmarks/core_sharing.py            # 40 steps a round
    uv run python apps/async_grpo/benchmarks/core_sharing.py --quick    # 10 steps a round

It times the tiny preset's train step (128 episodes of 4 + 8 tokens, one torch thread, in
this process) alone, beside a second process sampling from the same model in a loop (the
generator's work), and beside a second process running a pure Python loop (no memory
traffic, no vector units). Three rounds of the three conditions in turn cancel a steady
drift of the machine's speed; each condition's figure is the median over its rounds'
steps. The ratios printed are of medians measured in this run. With a core for each
process and nothing shared, both ratios are 1.00x.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path

from async_grpo.actors.cores import usable_cpus


def _tiny_model(out: Path) -> str:
    from async_grpo.config.presets import TINY_ARCH  # noqa: PLC0415
    from async_grpo.model.policy import write_random_checkpoint  # noqa: PLC0415
    from async_grpo.tasks.prompts import corpus_for  # noqa: PLC0415

    return str(write_random_checkpoint(out, TINY_ARCH, corpus_for("count", 1, 6), seed=0))


def _neighbour(kind: str, model_path: str, ready: Event, stop: Event) -> None:
    """The second process: samples like the generator (`kind` "sampling") or spins."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    if kind == "busy loop":
        ready.set()
        while not stop.is_set():
            for _ in range(10_000):
                pass
        return
    from async_grpo.config.presets import tiny  # noqa: PLC0415
    from async_grpo.generation.decoding import generate  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, load_tokenizer  # noqa: PLC0415

    model, tok = load_policy(model_path), load_tokenizer(model_path)
    prompts = [f"count to {1 + i % 6}:" for i in range(8)]
    rng = torch.Generator().manual_seed(0)
    generate(model, tok, prompts, tiny().sampling, 0, generator=rng)
    ready.set()
    while not stop.is_set():
        generate(model, tok, prompts, tiny().sampling, 0, generator=rng)


def _trainer(model_path: str) -> Callable[[], object]:
    """One train step of the tiny preset on a fixed batch of 128 episodes (4 + 8 tokens)."""
    import torch  # noqa: PLC0415
    from async_grpo.config.presets import tiny  # noqa: PLC0415
    from async_grpo.grpo.step import TrainerCore  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, load_tokenizer  # noqa: PLC0415
    from replay_buffer import EpisodeBatch  # noqa: PLC0415
    from replay_buffer.testing import make_episode  # noqa: PLC0415

    torch.set_num_threads(1)
    cfg, tok = tiny(), load_tokenizer(model_path)
    core = TrainerCore(
        load_policy(model_path),
        cfg.trainer,
        cfg.sampling,
        vocab_size=len(tok),
        pad_id=int(tok.pad_token_id or 0),
        total_steps=10_000,
    )
    batch = EpisodeBatch(
        make_episode(group_id=i // 16, prompt_len=4, response_len=8, advantage=i % 2 - 0.5)
        for i in range(128)
    )
    return lambda: core.step(batch, None)


def _time_steps(step: Callable[[], object], n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="train steps per condition a round")
    parser.add_argument("--quick", action="store_true", help="10 steps per condition a round")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    steps = 10 if args.quick else args.steps
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    conditions = ("alone", "sampling", "busy loop")
    times: dict[str, list[float]] = {c: [] for c in conditions}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = _tiny_model(Path(tmp) / "model")
        step = _trainer(model_path)
        _time_steps(step, 3)  # warm-up
        for _ in range(3):
            for condition in conditions:
                if condition == "alone":
                    times[condition] += _time_steps(step, steps)
                    continue
                ready, stop = ctx.Event(), ctx.Event()
                proc = ctx.Process(target=_neighbour, args=(condition, model_path, ready, stop))
                proc.start()
                try:
                    if not ready.wait(120):
                        raise RuntimeError(f"the {condition} process did not start within 120 s")
                    times[condition] += _time_steps(step, steps)
                finally:
                    stop.set()
                    proc.join(30)
                    if proc.is_alive():
                        proc.kill()
    alone = statistics.median(times["alone"])
    print(f"{usable_cpus()} CPUs; train step (tiny preset, 128 episodes), median of {3 * steps}:")
    for condition in conditions:
        ms = 1e3 * statistics.median(times[condition])
        ratio = statistics.median(times[condition]) / alone
        print(f"  {condition:<10} {ms:7.1f} ms  {ratio:.2f}x alone")


if __name__ == "__main__":
    main()
