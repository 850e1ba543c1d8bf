"""wandb tracking through MetricsWriter, offline (no network): the records and the resolved config
land in wandb's run files, and a resumed writer continues the same run id."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_hpc.config.schema import ExperimentConfig, WandbConfig
from areal_hpc.config.validate import validate
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import WANDB_ID_FILE, MetricsWriter

# wandb's offline .wandb file: a 7-byte header, then LevelDB log records in 32 KiB blocks (a 7-byte
# header each: CRC, length, type), each a serialized wandb Record protobuf.
BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(data: bytes) -> list:
    """The whole records of a .wandb file's bytes (a record still being written is left out)."""
    from wandb.proto.wandb_internal_pb2 import Record

    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if pos + HEADER + length > len(data):
            break
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def read_wandb_file(path: Path, timeout_s: float = 30.0) -> list:
    """The records of a finished run's file. wandb's finish() can return before its service has
    written them all, so this waits for the run's exit record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _records(path.read_bytes())
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def offline_run(wandb_dir: Path, run_id: str, nth: int = 0) -> dict:
    """The run, config and history that the nth offline run of `run_id` wrote."""
    runs = sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}"))
    files = list(runs[nth].glob(f"run-{run_id}.wandb"))
    out: dict = {"runs": len(runs), "history": []}
    for r in read_wandb_file(files[0]):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = r.run
            out["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":  # keys with a slash come as nested keys; wandb's own start with _
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out["history"].append({k: v for k, v in items.items() if not k.startswith("_")})
    return out


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """wandb in offline mode with every directory it writes inside tmp_path; returns WANDB_DIR."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var, sub in (("WANDB_DIR", "wandb-dir"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                     ("WANDB_DATA_DIR", "data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path / "wandb-dir"


def experiment(**wandb: object) -> ExperimentConfig:
    cfg = ExperimentConfig(name="wandb-test")
    cfg.logging.wandb = WandbConfig(**wandb)
    return cfg


def test_offline_run_holds_the_records_and_config_and_resume_continues_it(
        tmp_path: Path, offline: Path, capfd: pytest.CaptureFixture, recwarn: pytest.WarningsRecorder) -> None:
    run_dir, cfg = tmp_path / "run", experiment(mode="offline", project="areal-tests")
    w = MetricsWriter(run_dir, tensorboard=False, experiment=cfg)
    for step in (0, 1, 2):
        w.write(step, {"reward_mean": step / 2, "staleness_hist/1": 4.0})
    w.close()
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    first = offline_run(offline, run_id)
    assert (first["run"].run_id, first["run"].project, first["run"].display_name) == (run_id, "areal-tests", "wandb-test")
    assert first["config"]["rollout"]["eta"] == cfg.rollout.eta
    assert first["config"]["logging"]["wandb"]["mode"] == "offline"
    assert first["history"] == read_records(run_dir / "metrics.jsonl")

    # Resumed from the checkpoint of step 1: the same wandb run goes on from step 2. (wandb names an
    # offline run's directory by the second it started in, and a resumed run needs a new one.)
    time.sleep(1.1)
    w = MetricsWriter(run_dir, tensorboard=False, resume_step=1, experiment=cfg)
    w.write(2, {"reward_mean": 5.0})
    w.close()
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == run_id
    resumed = offline_run(offline, run_id, nth=1)
    assert resumed["runs"] == 2 and resumed["run"].run_id == run_id
    assert resumed["history"] == [{"step": 2, "reward_mean": 5.0}]

    # A fresh start in the same directory is a new wandb run.
    MetricsWriter(run_dir, tensorboard=False, experiment=cfg).close()
    assert (run_dir / WANDB_ID_FILE).read_text().strip() != run_id

    printed = capfd.readouterr()
    assert len((printed.out + printed.err).splitlines()) <= 12, printed  # a few lines per run, no flood
    assert not [str(w.message) for w in recwarn.list if "wandb" in str(w.filename)]


def test_disabled_by_default_and_never_imported(tmp_path: Path) -> None:
    assert ExperimentConfig().logging.wandb.mode == "disabled"
    program = ("import sys\nfrom areal_hpc.config.schema import ExperimentConfig\n"
               "from areal_hpc.metrics.writer import MetricsWriter\n"
               f"w = MetricsWriter({str(tmp_path)!r}, tensorboard=False, experiment=ExperimentConfig())\n"
               "w.write(1, {'x': 1.0})\nw.close()\nassert 'wandb' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120)
    assert not (tmp_path / WANDB_ID_FILE).exists() and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("wandb, problem", [
    ({"mode": "offline"}, "logging.wandb.project: must be set when logging.wandb.mode = 'offline'"),
    ({"mode": "online", "project": ""}, "logging.wandb.project: must be set when logging.wandb.mode = 'online'"),
    ({"mode": "on", "project": "p"}, "logging.wandb.mode = 'on': must be one of disabled, offline, online"),
])
def test_config_problems(wandb: dict, problem: str) -> None:
    assert problem in validate(experiment(**wandb), check_files=False)
    assert not [p for p in validate(experiment(mode="offline", project="p"), check_files=False) if "wandb" in p]
