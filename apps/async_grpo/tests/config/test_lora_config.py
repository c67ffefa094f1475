"""`--trainer.lora.*` on the command line: parsed into the trainer's section, and every bad
value one line (exit status 2) before anything is written or spawned."""

from pathlib import Path

import pytest
from async_grpo.cli.main import main
from async_grpo.config.args import build_config
from async_grpo.config.schema import QWEN2_PROJECTIONS
from jobs import SPAWN_REFUSED, refuse_spawn


def test_the_lora_section_is_parsed_and_off_by_default() -> None:
    assert not build_config([]).trainer.lora.enabled
    lora = build_config(
        ["--trainer.lora.rank", "8", "--trainer.lora.alpha", "32", "--trainer.lora.dropout", "0.1"]
    ).trainer.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.enabled) == (8, 32, 0.1, True)
    assert lora.target_modules.split(",") == list(QWEN2_PROJECTIONS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer.lora.rank", "-1"], "trainer.lora.rank must be >= 0 (0: no adapters), got -1"),
        (
            ["--trainer.lora.rank", "8", "--trainer.lora.alpha", "0"],
            "trainer.lora.alpha must be > 0, got 0",
        ),
        (["--trainer.lora.alpha", "-4"], "trainer.lora.alpha must be > 0, got -4"),
        (["--trainer.lora.dropout", "1"], "trainer.lora.dropout must be in [0, 1), got 1.0"),
        (
            ["--trainer.lora.rank", "8", "--trainer.lora.target_modules", "q_proj,attn_out"],
            "trainer.lora.target_modules: attn_out is not a linear module of this qwen2 model; "
            "its linear modules: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, "
            "v_proj",
        ),
        (
            ["--trainer.lora.rank", "8", "--trainer.procs", "2"],
            "trainer.lora.rank 8 with trainer.procs 2: LoRA runs on one trainer process",
        ),
    ],
)
def test_bad_lora_input_is_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["--preset", "tiny", *args, "--out_dir", str(out)], spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"async-grpo: error: {message}"), err
    assert err.count("\n") == 1, err
    assert not out.exists()  # refused before anything was written


def test_targets_are_checked_against_a_given_checkpoint(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--model", str(tiny_checkpoint), "--out_dir", str(tmp_path / "out")]
    lora = ["--trainer.lora.rank", "4", "--trainer.lora.target_modules", "mlp.up_proj,lm_head"]
    main([*args, *lora], spawn=refuse_spawn)
    assert SPAWN_REFUSED in capsys.readouterr().err  # every check passed: it would start
    lora[-1] = "mlp"
    assert main([*args, *lora], spawn=refuse_spawn) == 2
    assert "trainer.lora.target_modules: mlp is not a linear module" in capsys.readouterr().err
