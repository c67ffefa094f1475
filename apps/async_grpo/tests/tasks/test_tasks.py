"""Task generators, dataset files and reward functions."""

import json
import random
from pathlib import Path

import pytest
from async_grpo.tasks.prompts import arithmetic_sample, count_sample, load_hf_dataset, load_jsonl
from async_grpo.tasks.rewards import (
    combined,
    count_score,
    exact_match,
    number_format,
    numeric_answer,
)


def test_count_sample() -> None:
    rng = random.Random(0)
    for _ in range(50):
        s = count_sample(rng, 2, 5)
        n = int(s.prompt.removeprefix("count to ").removesuffix(":"))
        assert 2 <= n <= 5
        assert s.target == " ".join(str(i) for i in range(1, n + 1))


def test_arithmetic_sample_target_is_the_answer() -> None:
    rng = random.Random(1)
    for _ in range(50):
        s = arithmetic_sample(rng, 2, 9)
        numbers = [
            int(w) for w in s.prompt.replace("?", " ").replace(".", " ").split() if w.isdigit()
        ]
        a, b = numbers
        assert int(s.target) == (a + b if "more" in s.prompt else a - b)


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("1 2 3", 1.0),
        ("1 2", 2 / 3),  # one missing
        ("1 2 3 4", 3 / 4),  # one extra
        ("1 5 3", 2 / 3),  # one wrong
        ("2 3", 0.0),  # shifted: no position right
        ("", 0.0),
    ],
)
def test_count_score(response: str, score: float) -> None:
    assert count_score(response, "1 2 3") == pytest.approx(score)


def test_other_rewards() -> None:
    assert exact_match(" 7 ", "7") == 1.0
    assert exact_match("7.", "7") == 0.0
    assert numeric_answer("so the answer is 12", "12") == 1.0
    assert numeric_answer("12 or 13", "12") == 0.0
    assert number_format("42", "x") == 1.0
    assert number_format("the 42", "x") == 0.0
    fn = combined({"numeric": 0.9, "format": 0.1})
    assert fn("41", "42") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown reward"):
        combined({"nope": 1.0})


def test_load_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"prompt": "p1", "target": "t1"}) + "\n\n" + '{"prompt": "p2", "target": 3}\n'
    )
    samples = load_jsonl(path)
    assert [(s.prompt, s.target) for s in samples] == [("p1", "t1"), ("p2", "3")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "malformed JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"prompt": "p"}', "missing key"),
    ],
)
def test_load_jsonl_reports_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "target": "b"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"d\.jsonl:2: {message}"):
        load_jsonl(path)


def test_load_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_hf_dataset_without_datasets_installed_is_a_clear_error() -> None:
    pytest.importorskip("torch")
    try:
        import datasets  # type: ignore[import-not-found,unused-ignore]  # noqa: F401, PLC0415
    except ImportError:
        with pytest.raises(RuntimeError, match="needs the Hugging Face `datasets` package"):
            load_hf_dataset("some/name", "train", "prompt", "target")
    else:
        pytest.skip("datasets is installed")
