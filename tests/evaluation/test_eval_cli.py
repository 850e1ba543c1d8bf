"""`areal-hpc eval` argument handling, presets and the merge of shards (no engines started)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from areal_hpc.cli import main
from areal_hpc.errors import UserError
from areal_hpc.evaluation import responses
from areal_hpc.evaluation.presets import PRESETS, Sampling, resolve
from areal_hpc.evaluation.responses import Response

NONE = {"n": None, "temperature": None, "top_p": None, "max_new_tokens": None}


def test_aime_preset_is_the_papers_protocol_and_flags_override_it():
    assert resolve("aime", NONE, 7) == Sampling(32, 0.6, 0.95, 32768, 7)
    assert resolve("aime", {**NONE, "n": 4, "temperature": 1.0}, 7) == Sampling(4, 1.0, 0.95, 32768, 7)
    assert set(PRESETS) == {"aime"}


def test_sampling_errors_name_the_flag():
    with pytest.raises(UserError, match="--preset 'amie': unknown"):
        resolve("amie", NONE, 1)
    with pytest.raises(UserError, match="missing --top-p, --max-new-tokens"):
        resolve(None, {**NONE, "n": 1, "temperature": 0.0}, 1)
    with pytest.raises(UserError, match="--top-p 0.0"):
        resolve("aime", {**NONE, "top_p": 0.0}, 1)
    with pytest.raises(UserError, match="--n 0"):
        resolve("aime", {**NONE, "n": 0}, 1)


def eval_args(model: Path, data: str, out: Path, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--data", data, "--out", str(out), "--preset", "aime", *extra]


def test_user_errors_exit_2(eval_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    rows = tmp_path / "a" / "set.jsonl"
    rows.parent.mkdir()
    rows.write_text(json.dumps({"prompt": "Q: 1+1 = ?\nA:", "answer": "2"}) + "\n")
    twin = tmp_path / "b" / "set.jsonl"
    twin.parent.mkdir()
    twin.write_text(rows.read_text())
    cases = [
        (eval_args(tmp_path, str(rows), tmp_path / "o"), "no config.json"),
        (eval_args(eval_model_dir, f"{rows},{twin}", tmp_path / "o"), "several files are named set"),
        (eval_args(eval_model_dir, str(tmp_path / "missing.jsonl"), tmp_path / "o"), "missing.jsonl: file not found"),
        (eval_args(eval_model_dir, str(rows), tmp_path / "o", "--shard", "2/2"), "--shard '2/2'"),
        (eval_args(eval_model_dir, str(rows), tmp_path / "o", "--engines", "0"), "--engines 0"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err


def response(prompt: int, sample: int, correct: bool, answer: str | None) -> Response:
    return Response(prompt, sample, "s", "math", f"... {answer}", answer, 5.0 if correct else -5.0, correct,
                    "r", 3, "stop")


def test_merge_makes_one_summary_of_all_shards(tmp_path: Path, capsys: pytest.CaptureFixture):
    sampling = asdict(Sampling(2, 0.6, 0.95, 64, 1))
    shards = {0: [response(0, 0, True, "1"), response(0, 1, True, "1"), response(2, 0, False, "3"),
                  response(2, 1, False, None)],
              1: [response(1, 0, False, "7"), response(1, 1, True, "2")]}
    for i, rs in shards.items():
        responses.write(tmp_path / responses.file_name("set", (i, 2)), rs)
    meta = {"model": "m", "sampling": sampling, "datasets": ["set"], "wall_s": 3.0}
    (tmp_path / "shard-0-of-2.json").write_text(json.dumps(meta))
    assert main(["eval-merge", "--out", str(tmp_path)]) == 2
    assert "shards missing: shard-1-of-2.json" in capsys.readouterr().err

    (tmp_path / "shard-1-of-2.json").write_text(json.dumps({**meta, "wall_s": 5.0}))
    assert main(["eval-merge", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["model"] == "m" and summary["sampling"] == sampling and summary["wall_s"] == 5.0
    s = summary["datasets"]["set"]
    assert s["rows"] == 3 and s["samples"] == 6
    assert s["avg@n"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert s["pass@k"] == pytest.approx({"1": 0.5, "2": 2 / 3})
    assert s["maj@n"] == pytest.approx(1 / 3)  # prompt 1's tie goes to "7", wrong
    merged = responses.read(tmp_path / "set.responses.jsonl")
    assert [(r.prompt, r.sample) for r in merged] == [(p, s) for p in range(3) for s in range(2)]
    assert "set" in capsys.readouterr().out  # the table


@pytest.mark.parametrize("source, happened", [
    ("import os\ndef score(**kw):\n    os._exit(3)\n", "the process exited with status 3"),
    ("import os\nos._exit(4)\n", "the process exited with status 4"),
    ("def score(**kw):\n    held = []\n    while True:\n        held.append(bytearray(64 << 20))\n",
     "ran out of memory (MemoryError: it allocated past reward.memory_mb)"),
])
def test_a_custom_function_that_ends_its_process_or_its_memory_stops_eval_naming_it(
        eval_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, source: str, happened: str):
    """The function is called once, in a process of its own, before any engine starts: its end is
    one line naming it, and the command exits 2."""
    fn = tmp_path / "bad_reward.py"
    fn.write_text(source)
    rows = tmp_path / "set.jsonl"
    rows.write_text(json.dumps({"prompt": "Q: 1+1 = ?\nA:", "answer": "2"}) + "\n")
    config = tmp_path / "exp.yaml"
    config.write_text(f"reward: {{kind: custom, function: '{fn}:score', memory_mb: 256}}\n")
    assert main(eval_args(eval_model_dir, str(rows), tmp_path / "o", "--config", str(config))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: reward.function = '{fn}:score': called on row 1 of {rows}") and happened in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
