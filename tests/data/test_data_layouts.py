"""Data as users bring it: verl parquet, AReaL math and code JSON lines, dotted keys, directories
of shards and datasets' save_to_disk directories, each read into the same PromptRows."""

from __future__ import annotations

import json
import tempfile

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chat_data import verl_row, write_verl

from areal_hpc.config.schema import DataConfig, RewardConfig
from areal_hpc.data.prompts import load_prompts
from areal_hpc.errors import DataError
from areal_hpc.prompt_row import PromptRow
from areal_hpc.reward.references import references
from areal_hpc.reward.task import CodeReference, MathReference

VERL = DataConfig(layout="verl")


def test_verl_parquet_rows_keep_their_messages_source_and_extra_info(tmp_path):
    f = write_verl(tmp_path / "train.parquet", [verl_row(0, "Q: 1+2 = ?", "3"),
                                                verl_row(1, "Q: 2*3 = ?", "6", "math/other", system=True)])
    rows = load_prompts(f, VERL)
    assert rows[0] == PromptRow([{"role": "user", "content": "Q: 1+2 = ?"}], "3", "openai/gsm8k",
                                {"split": "train", "index": 0})
    assert rows[1].prompt == [{"role": "system", "content": "Put the answer in \\boxed{}."},
                              {"role": "user", "content": "Q: 2*3 = ?"}]
    assert (rows[1].answer, rows[1].data_source) == ("6", "math/other")


def test_areal_math_solutions_give_their_first_element(tmp_path):
    f = tmp_path / "math.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "<|User|>What is 2+2?<|Assistant|><think>\n", "solutions": ["\\boxed{4}", "4"], "query_id": "a1"},
        {"prompt": "What is 3+3?", "solutions": ["\\boxed{6}"], "query_id": 7},
    ]) + "\n")
    rows = load_prompts(f, DataConfig(layout="areal-math"))
    assert rows == [PromptRow("<|User|>What is 2+2?<|Assistant|><think>\n", "\\boxed{4}"),
                    PromptRow("What is 3+3?", "\\boxed{6}")]
    assert references(rows, RewardConfig(), "math.jsonl") == [MathReference("\\boxed{4}"), MathReference("\\boxed{6}")]
    f.write_text('{"prompt": "x", "solutions": [], "query_id": 1}\n')
    with pytest.raises(DataError, match=r"math.jsonl: line 1: field 'solutions' must be a string, a number, a list"):
        load_prompts(f, DataConfig(layout="areal-math"))


def test_areal_code_input_output_becomes_code_tests(tmp_path):
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    f = tmp_path / "code.jsonl"
    f.write_text(json.dumps({"prompt": "Add two numbers.", "input_output": json.dumps(tests), "query_id": 1}) + "\n"
                 + json.dumps({"prompt": "Add again.", "input_output": tests, "query_id": 2}) + "\n")
    rows = load_prompts(f, DataConfig(layout="areal-code"))
    assert rows[0].answer == json.dumps(tests) and json.loads(rows[1].answer) == tests  # an object: its JSON
    refs = references(rows, RewardConfig(kind="code"), "code.jsonl")
    assert all(isinstance(r, CodeReference) and r.tests.cases[0].expected == "3\n" for r in refs)


def test_dotted_keys_reach_into_objects_and_a_missing_one_names_row_key_and_fields(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"q": {"text": "1+1?"}, "meta": {"answer": {"value": 2}}}\n'
                 '{"q": {"text": "2+2?"}, "meta": {"answer": {"vaule": 4}, "level": 1}}\n')
    data = DataConfig(prompt_key="q.text", answer_key="meta.answer.value")
    with pytest.raises(DataError, match=r"d\.jsonl: line 2: missing field 'meta\.answer\.value' \('meta\.answer'"
                                        r" has fields: vaule\)"):
        load_prompts(f, data)
    f.write_text('{"q": {"text": "1+1?"}, "meta": {"answer": {"value": 2}}}\n')
    assert load_prompts(f, data) == [PromptRow("1+1?", "2")]
    f = write_verl(tmp_path / "v.parquet", [verl_row(0, "a", "1"), verl_row(1, "b", "2")])
    with pytest.raises(DataError, match=r"v\.parquet: row 1: missing field 'reward_model\.answer' \('reward_model'"
                                        r" has fields: style, ground_truth\)"):
        load_prompts(f, DataConfig(layout="verl", answer_key="reward_model.answer"))
    with pytest.raises(DataError, match=r"v\.parquet: no column 'rm' for 'rm\.ground_truth' \(columns: data_source,"):
        load_prompts(f, DataConfig(answer_key="rm.ground_truth"))


def test_chat_messages_must_have_role_and_content(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant"}], "answer": "1"}\n')
    with pytest.raises(DataError, match=r"line 1: field 'prompt' message 1: expected \{\"role\": str, \"content\": str\}"):
        load_prompts(f, DataConfig())


def test_a_directory_of_parquet_shards_is_one_data_set_in_name_order(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_verl(shards / "part-00001.parquet", [verl_row(2, "c", "3"), verl_row(3, "d", "\\frac{1")])
    write_verl(shards / "part-00000.parquet", [verl_row(0, "a", "1"), verl_row(1, "b", "2")])
    rows = load_prompts(shards, VERL)
    assert [r.answer for r in rows] == ["1", "2", "3", "\\frac{1"]
    with pytest.raises(DataError, match=r"shards: 1 of 4 rows have an unusable reference answer: row 4: "):
        references(rows, RewardConfig(), str(shards))
    pq.write_table(pa.table({"other": [1]}), shards / "part-00002.parquet")
    with pytest.raises(DataError, match=r"shards: not a readable Parquet file \(.*column names don't match"):
        load_prompts(shards, VERL)


def test_a_directory_of_jsonl_shards_names_the_shard_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "a", "answer": "1"}\n')
    (tmp_path / "b.jsonl").write_text('{"prompt": "b", "answer": "2"}\n{"prompt": "c"}\n')
    with pytest.raises(DataError, match=r"b\.jsonl: line 2: missing field 'answer'"):
        load_prompts(tmp_path, DataConfig())
    (tmp_path / "b.jsonl").write_text('{"prompt": "b", "answer": "2"}\n')
    assert [r.prompt for r in load_prompts(tmp_path, DataConfig())] == ["a", "b"]
    write_verl(tmp_path / "c.parquet", [verl_row(0, "a", "1")])
    with pytest.raises(DataError, match="both"):
        load_prompts(tmp_path, DataConfig())


def test_save_to_disk_datasets_and_dataset_dicts(tmp_path):
    train = datasets.Dataset.from_list([verl_row(0, "a", "1"), verl_row(1, "b", "2")])
    test = datasets.Dataset.from_list([verl_row(9, "z", "9")])
    train.save_to_disk(str(tmp_path / "one"))
    assert [r.answer for r in load_prompts(tmp_path / "one", VERL)] == ["1", "2"]
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    assert [r.answer for r in load_prompts(tmp_path / "dict", VERL)] == ["1", "2"]  # the train split
    assert [r.answer for r in load_prompts(tmp_path / "dict" / "test", VERL)] == ["9"]
    datasets.DatasetDict({"validation": test, "test": test}).save_to_disk(str(tmp_path / "no-train"))
    with pytest.raises(DataError, match=r"no-train: a DatasetDict without a 'train' split \(splits: validation, test\)"):
        load_prompts(tmp_path / "no-train", VERL)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: a directory with no"):
        load_prompts(tmp_path / "empty", VERL)


def test_datasets_reads_quietly_with_its_cache_in_a_deleted_temporary_directory(tmp_path, capfd, monkeypatch):
    f = write_verl(tmp_path / "d.parquet", [verl_row(i, f"q{i}", str(i)) for i in range(3)])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    capfd.readouterr()
    assert len(load_prompts(f, VERL)) == 3
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # no progress bars, no info logs
    assert list(scratch.iterdir()) == []
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable Parquet file \(.*magic bytes not found"):
        load_prompts(tmp_path / "bad.parquet", VERL)
    assert capfd.readouterr() == ("", "")  # the DataError is the only report
    assert list(scratch.iterdir()) == []
