"""Prompt data: JSON lines / JSON / Parquet loading with row numbers in errors; the prompt stream."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from areal_hpc.config.schema import DataConfig
from areal_hpc.data.prompts import load_prompts, train_and_eval_prompts
from areal_hpc.data.stream import PromptStream
from areal_hpc.errors import DataError
from areal_hpc.prompt_row import PromptRow

FLAT = DataConfig()


def test_jsonl_rows_and_numeric_answers(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "1+1?", "answer": 2}\n\n{"prompt": "2+2?", "answer": "4", "extra": 1}\n')
    assert load_prompts(f, FLAT) == [PromptRow("1+1?", "2"), PromptRow("2+2?", "4")]


@pytest.mark.parametrize(
    "lines, fragment",
    [
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "answer": 2', ""], "line 2: not valid JSON"),
        (['{"prompt": "a", "answer": "1"}', "", '{"prompt": "b"}'], "line 3: missing field 'answer'"),
        (['{"prompt": 5, "answer": "1"}'], "line 1: field 'prompt' must be a non-empty string"),
        (['["a", "1"]'], "line 1: expected an object"),
    ],
)
def test_malformed_jsonl_names_the_line(tmp_path, lines, fragment):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines))
    with pytest.raises(DataError, match=fragment):
        load_prompts(f, FLAT)


def test_json_array_and_custom_keys(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps([{"problem": "x?", "solution": "3"}, {"problem": "y?"}]))
    with pytest.raises(DataError, match="row 2: missing field 'solution'"):
        load_prompts(f, DataConfig(prompt_key="problem", answer_key="solution"))


def test_parquet(tmp_path):
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?"], "answer": ["1", None]}), f)
    with pytest.raises(DataError, match="row 2: missing field 'answer'"):
        load_prompts(f, FLAT)
    pq.write_table(pa.table({"question": ["a?"]}), f)
    with pytest.raises(DataError, match="no column 'prompt'"):
        load_prompts(f, FLAT)
    pq.write_table(pa.table({"prompt": ["a?"], "answer": [7]}), f)
    assert load_prompts(f, FLAT) == [PromptRow("a?", "7")]


def test_unknown_suffix_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_prompts(tmp_path / "nope.jsonl", FLAT)
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(DataError, match="unknown format"):
        load_prompts(tmp_path / "d.csv", FLAT)
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no rows"):
        load_prompts(tmp_path / "e.jsonl", FLAT)


def test_data_source_and_extra_info_from_jsonl_and_parquet(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a?", "answer": "1", "data_source": "openai/gsm8k", "extra_info": {"split": "train"}}\n'
                 '{"prompt": "b?", "answer": "2", "data_source": null}\n')
    assert load_prompts(f, FLAT) == [PromptRow("a?", "1", "openai/gsm8k", {"split": "train"}), PromptRow("b?", "2")]
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?"], "answer": ["1", "2"], "data_source": ["mine", "livecodebench"],
                             "extra_info": [{"index": 0}, {"index": 1}]}), f)
    assert [(r.data_source, r.extra_info) for r in load_prompts(f, FLAT)] == [("mine", {"index": 0}),
                                                                         ("livecodebench", {"index": 1})]


@pytest.mark.parametrize("fields, fragment", [
    ('"data_source": 3', "line 1: field 'data_source' must be a non-empty string"),
    ('"data_source": ""', "line 1: field 'data_source' must be a non-empty string"),
    ('"extra_info": [1]', "line 1: field 'extra_info' must be an object"),
])
def test_bad_data_source_or_extra_info_names_the_line(tmp_path, fields, fragment):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a?", "answer": "1", ' + fields + "}\n")
    with pytest.raises(DataError, match=fragment):
        load_prompts(f, FLAT)


def test_synthetic_default_and_file_override(tmp_path):
    data = DataConfig(synthetic_train_size=20, synthetic_eval_size=5)
    train, [(name, held_out)] = train_and_eval_prompts(data, seed=1)
    assert len(train) == 20 and len(held_out) == 5 and name == "synthetic"
    assert not {r.prompt for r in train} & {r.prompt for r in held_out}
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "p", "answer": "a"}\n')
    data.train_path = str(f)
    assert train_and_eval_prompts(data, seed=1)[0] == [PromptRow("p", "a")]
    g = tmp_path / "aime.jsonl"
    g.write_text('{"prompt": "q", "answer": "b"}\n{"prompt": "r", "answer": "c"}\n')
    data.eval_path = str(f)
    assert train_and_eval_prompts(data, seed=1)[1] == [("t", [PromptRow("p", "a")])]
    sets = train_and_eval_prompts(data, seed=1, eval_paths=[str(g), str(f)])[1]  # eval.paths wins
    assert [(n, len(rows)) for n, rows in sets] == [("aime", 2), ("t", 1)]


def test_stream_is_reproducible_covers_each_epoch_and_reissues_returned_ids():
    s = PromptStream(5, seed=3)
    ids = [s.next() for _ in range(10)]
    assert ids == list(range(10))
    assert sorted(s.index(i) for i in range(5)) == list(range(5))
    assert sorted(s.index(i) for i in range(5, 10)) == list(range(5))
    assert [s.index(i) for i in range(10)] == [PromptStream(5, seed=3).index(i) for i in range(10)]
    state = s.state_dict(reissue=[2, 7])
    t = PromptStream(5, seed=3)
    t.load_state_dict(state)
    assert [t.next() for _ in range(3)] == [2, 7, 10]
    assert t.state_dict(reissue=[4]) == {"position": 11, "returned": [4]}
    assert [PromptStream(4, 0, shuffle=False).index(i) for i in range(6)] == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_file_that_is_not_utf8_names_its_line(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    rows = ['{"prompt": "1+1", "answer": "2"}', '{"prompt": "caf\xe9", "answer": "3"}']
    text = "\n".join(rows) if suffix == ".jsonl" else "[\n" + ",\n".join(rows) + "\n]"
    path.write_bytes(text.encode("latin-1"))
    line = 2 if suffix == ".jsonl" else 3
    with pytest.raises(DataError, match=rf"data{suffix}: line {line}: not UTF-8 text \(byte 0xe9"):
        load_prompts(path, FLAT)
    path.write_text('{"prompt": "a\u2028b", "answer": "1"}\n', encoding="utf-8")  # a JSON line with U+2028
    if suffix == ".jsonl":
        assert load_prompts(path, FLAT)[0].prompt == "a\u2028b"
