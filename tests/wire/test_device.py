"""Every device decision keys on the configured device, resolved in one place (wire/device.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError
from areal_hpc.wire import device

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("requested,cuda,resolved", [
    ("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cpu", False, "cpu"),
    ("cuda", True, "cuda"),
])
def test_resolution(requested: str, cuda: bool, resolved: str) -> None:
    assert device.resolve(requested, cuda) == resolved


def test_cuda_without_a_gpu_is_the_users_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ConfigError, match=r"device = 'cuda' but no CUDA device is visible to this rank "
                                          r"\(CUDA_VISIBLE_DEVICES='4,5'\)"):
        device.resolve("cuda", False)


def test_cpu_never_asks_cuda() -> None:
    """`device: cpu` does not initialise CUDA (a generator binds its GPUs before anything does)."""
    before = device.cuda_visible.cache_info()
    assert device.device_of(load_config("configs/experiments/tiny-cpu.yaml", ["device=cpu"])) == "cpu"
    assert device.cuda_visible.cache_info() == before


def test_only_the_resolver_asks_torch_for_cuda() -> None:
    """No other module of the package or the benchmarks decides by torch.cuda.is_available()."""
    asking = re.compile(r"torch\.cuda\.is_available\(")
    found = [str(p.relative_to(ROOT)) for folder in ("areal_hpc", "benchmarks") for p in (ROOT / folder).rglob("*.py")
             if asking.search(p.read_text())]
    assert [f for f in found if f != "areal_hpc/wire/device.py"] == []
