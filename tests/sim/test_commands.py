"""`areal-hpc sim scaling|hours|staleness`: the JSON interface and bad arguments."""

from __future__ import annotations

import json

import pytest

from areal_hpc.cli import main
from areal_hpc.sim import predict


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    """--quick, shortened further: these tests check the interface, not the numbers."""
    monkeypatch.setattr(predict, "QUICK", predict.Fidelity(steps=1, sync_steps=1))


def run_json(capsys: pytest.CaptureFixture, *args: str):
    assert main(["sim", *args, "--json", "--quick"]) == 0
    return json.loads(capsys.readouterr().out)


def test_scaling_json(capsys):
    rows = run_json(capsys, "scaling", "--model", "1.5b", "--context", "8192", "--gpus", "16,32",
                    "--system", "sync")
    assert [r["gpus"] for r in rows] == [16, 32]
    assert all(isinstance(r["tokens_per_s"], float) and r["tokens_per_s"] > 0 for r in rows)
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]


def test_scaling_reports_out_of_memory_as_null(capsys):
    rows = run_json(capsys, "scaling", "--model", "32b", "--context", "32768", "--gpus", "256",
                    "--system", "sync")
    assert rows == [{"gpus": 256, "tokens_per_s": None}]


def test_hours_json(capsys):
    """The printed hours are the simulated run's: the first step (pipeline fill), then 9 steady ones."""
    out = run_json(capsys, "hours", "--model", "1.5b", "--nodes", "2", "--steps", "10", "--system", "areal")
    run = predict.hours("1.5b", 2, "areal", fidelity=predict.QUICK).run
    assert set(out) == {"hours"}
    assert out["hours"] == pytest.approx((run.first_step_s + 9 * run.step_s) / 3600, rel=1e-9)
    assert run.first_step_s >= run.step_s > 0
    later = run_json(capsys, "hours", "--model", "1.5b", "--nodes", "2", "--steps", "20", "--system", "areal")
    assert later["hours"] - out["hours"] == pytest.approx(10 * run.step_s / 3600, rel=1e-9)


def test_hours_follow_the_generation_cap_and_eta(capsys):
    """Table 1's 1.5B runs generated at most 8,192 tokens: a shorter cap is fewer hours, and eta 0
    on the asynchronous system's GPUs ("sync AReaL") is more hours than eta 4."""
    args = ("hours", "--model", "1.5b", "--nodes", "2", "--steps", "10", "--system", "areal")
    full = run_json(capsys, *args)["hours"]
    capped = run_json(capsys, *args, "--context", str(1024 + 8192))["hours"]
    synchronous = run_json(capsys, *args, "--context", str(1024 + 8192), "--eta", "0")["hours"]
    assert capped < full
    assert synchronous > run_json(capsys, *args, "--context", str(1024 + 8192), "--eta", "4")["hours"]


def test_staleness_json(capsys):
    rows = run_json(capsys, "staleness", "--model", "1.5b", "--gpus", "16", "--etas", "0,2",
                    "--context", "4096", "--gate", "strict")
    assert [r["eta"] for r in rows] == [0, 2]
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]
    assert rows[0]["max_staleness"] == 0 and 1 <= rows[1]["max_staleness"] <= 2


def test_staleness_gate_option(capsys):
    args = ("staleness", "--model", "1.5b", "--gpus", "16", "--etas", "1", "--context", "4096", "--quick")
    strict = run_json(capsys, *args, "--gate", "strict")[0]
    loose = run_json(capsys, *args, "--gate", "admission")[0]
    assert strict["max_staleness"] <= 1
    assert loose["tokens_per_s"] >= strict["tokens_per_s"]


def test_tables_without_json(capsys):
    assert main(["sim", "scaling", "--model", "32b", "--context", "32768", "--gpus", "256", "--system", "sync"]) == 0
    assert "out of memory: a trainer GPU needs" in capsys.readouterr().out
    assert main(["sim", "staleness", "--model", "1.5b", "--gpus", "16", "--etas", "1", "--context", "4096",
                 "--quick"]) == 0
    out = capsys.readouterr().out
    assert "generator GPUs" in out and "steps/h" in out and "GPU idle" in out


@pytest.mark.parametrize("args, message", [
    (["scaling", "--model", "1.5b", "--context", "8192", "--gpus", "32,x", "--system", "areal"],
     "comma-separated integers"),
    (["scaling", "--model", "3b", "--context", "8192", "--gpus", "32", "--system", "areal"], "unknown model"),
    (["scaling", "--model", "1.5b", "--context", "8192", "--gpus", "32", "--system", "ppo"], "unknown system"),
    (["scaling", "--model", "1.5b", "--context", "512", "--gpus", "32", "--system", "areal"], "no room"),
    (["scaling", "--model", "32b", "--context", "8192", "--gpus", "16", "--system", "areal"], "trainer replica"),
    (["hours", "--model", "1.5b", "--nodes", "0", "--steps", "10"], "must be positive"),
    (["hours", "--model", "1.5b", "--nodes", "2", "--steps", "0"], "must be positive"),
    (["hours", "--model", "1.5b", "--nodes", "2", "--steps", "10", "--eta", "-1"], "eta must be >= 0"),
    (["hours", "--model", "1.5b", "--nodes", "2", "--steps", "10", "--context", "512"], "no room"),
    (["staleness", "--model", "1.5b", "--gpus", "32", "--etas", "-1"], "eta must be >= 0"),
    (["scaling", "--model", "1.5b", "--context", "8192", "--gpus", "32", "--hardware", "a100"], "unknown hardware"),
])
def test_bad_arguments_are_one_message_and_exit_2(capsys, args, message):
    assert main(["sim", *args, "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
