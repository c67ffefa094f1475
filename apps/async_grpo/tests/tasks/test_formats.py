"""GSM8K- and MATH-format files as distributed: the prompts and targets read from them, the
normalised targets, and each bad row refused in one line naming the file, line and key."""

import json
from pathlib import Path

import pytest
from async_grpo.cli.main import main
from async_grpo.tasks.formats import gsm8k_target, last_boxed, strip_thousands
from async_grpo.tasks.math_reward import math_score
from async_grpo.tasks.prompts import load_jsonl
from jobs import refuse_spawn

GSM8K_ROWS = [
    {
        "question": "Ana has 3 apples and gets 4 more. How many apples does she have?",
        "answer": "Ana has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
    },
    {
        "question": "A club sells 250 tickets at $4 each. How many dollars does it take in?",
        "answer": "250 * 4 = <<250*4=1000>>1000 dollars.\n#### 1,000",
    },
    {"question": "Half of 5?", "answer": "5 / 2 = 2.5\n#### 2.5"},
    {"question": "How many grains?", "answer": "#### 1,234,567"},
]

MATH_ROWS = [
    {
        "problem": "What is $\\frac{3}{8} + \\frac{3}{8}$?",
        "solution": "The sum is $\\frac{6}{8} = \\boxed{\\dfrac{3}{4}}$.",
        "level": "Level 1",
        "type": "Prealgebra",
    },
    {
        # The last box is the answer; braces nest inside it.
        "problem": "Simplify $x \\cdot x$, then halve $1$.",
        "solution": "First $\\boxed{x^{2}}$, and then $\\boxed{\\frac{1}{2}}$.",
    },
    {
        "problem": "Which numbers solve $(x-1)(x-2)=0$?",
        "solution": "The roots form $\\boxed{\\{1,2\\}}$.",
    },
]


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_file_targets_are_the_final_answers_normalised(tmp_path: Path) -> None:
    samples = load_jsonl(write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS), fmt="gsm8k")
    assert [s.prompt for s in samples] == [r["question"] for r in GSM8K_ROWS]
    assert [s.target for s in samples] == ["7", "1000", "2.5", "1234567"]
    # A response in GSM8K's own style, separators included, earns the reward.
    assert math_score("250 * 4 = 1000 dollars.\n#### 1,000", samples[1].target) == 1.0
    assert math_score("so \\boxed{\\frac{5}{2}}", samples[2].target) == 1.0


def test_math_file_targets_are_the_last_boxed_answers(tmp_path: Path) -> None:
    samples = load_jsonl(write_jsonl(tmp_path / "math.jsonl", MATH_ROWS), fmt="math")
    assert [s.prompt for s in samples] == [r["problem"] for r in MATH_ROWS]
    assert [s.target for s in samples] == ["\\dfrac{3}{4}", "\\frac{1}{2}", "\\{1,2\\}"]
    assert math_score("It is 0.75.", samples[0].target) == 1.0
    assert math_score("\\boxed{0.5}", samples[1].target) == 1.0
    assert math_score("\\boxed{\\{2, 1\\}}", samples[2].target) == 1.0
    assert math_score("\\boxed{\\{1, 3\\}}", samples[2].target) == 0.0


def test_jsonl_format_is_unchanged(tmp_path: Path) -> None:
    # The default reads `prompt` / `target` as they are: no `####` or `\boxed` is looked for.
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "target": "#### 1,000"}])
    assert [(s.prompt, s.target) for s in load_jsonl(path)] == [("p", "#### 1,000")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,000", "1000"),
        ("1,234,567.5", "1234567.5"),
        ("-12,000", "-12000"),
        ("(1, 2)", "(1, 2)"),  # a pair, not a separator
        ("1,2", "1,2"),
        ("1,0000", "1,0000"),  # not a group of three
    ],
)
def test_strip_thousands(text: str, expected: str) -> None:
    assert strip_thousands(text) == expected


def test_gsm8k_target_takes_the_last_mark() -> None:
    assert gsm8k_target("a #### b\n####  42 ") == "42"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{5}", "5"),
        ("\\boxed{1} and \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
        ("\\boxed{\\sqrt{\\frac{1}{2}}} more", "\\sqrt{\\frac{1}{2}}"),
        ("\\boxed{\\{1\\}}", "\\{1\\}"),  # printed braces do not close the box
        ("no box", None),
        ("\\boxed{1} then \\boxed{2", None),  # the last one never closes
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("fmt", "row", "message"),
    [
        ("gsm8k", {"question": "q"}, "missing key(s) answer"),
        ("gsm8k", {"answer": "#### 1"}, "missing key(s) question"),
        ("gsm8k", {"prompt": "q", "target": "1"}, "missing key(s) question, answer"),
        ("gsm8k", {"question": "q", "answer": "it is 4"}, "key 'answer': no '####' final answer"),
        ("gsm8k", {"question": "q", "answer": "4 ####  "}, "key 'answer': no final answer after"),
        ("math", {"problem": "p"}, "missing key(s) solution"),
        ("math", {"problem": "p", "solution": "it is 4"}, "key 'solution': no complete \\boxed"),
        ("math", {"problem": "p", "solution": "\\boxed{4"}, "key 'solution': no complete \\boxed"),
        ("math", {"problem": "p", "solution": "\\boxed{ }"}, "key 'solution': an empty \\boxed{}"),
    ],
)
def test_bad_row_names_file_line_and_key(
    tmp_path: Path, fmt: str, row: dict[str, str], message: str
) -> None:
    good = GSM8K_ROWS[0] if fmt == "gsm8k" else MATH_ROWS[0]
    path = write_jsonl(tmp_path / "d.jsonl", [good, row])
    with pytest.raises(ValueError, match=r"d\.jsonl:2: ") as e:
        load_jsonl(path, fmt=fmt)  # type: ignore[arg-type]
    assert str(e.value).startswith(f"{path}:2: {message}"), e.value
    assert "\n" not in str(e.value)


def test_bad_math_file_on_the_command_line_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "math.jsonl", [*MATH_ROWS, {"problem": "p", "solution": "4"}])
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--data.path", str(path), "--data.format", "math"]
    assert main([*args, "--reward.fns", "math", "--out_dir", str(out)], spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err == (
        f"async-grpo: error: data.path: {path}:4: key 'solution': no complete \\boxed{{...}} "
        "answer\n"
    )
    assert not out.exists()


def test_a_format_without_a_dataset_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--data.format", "gsm8k", "--out_dir", str(out)]
    assert main(args, spawn=refuse_spawn) == 2
    assert "data.format gsm8k reads a dataset: give --data.path FILE" in capsys.readouterr().err
    assert not out.exists()
