"""Fixtures of the controller tests: the warm-started tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpi_jobs import CONFIG


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    """The cached warm-started tiny model (prepared once per machine, minutes the first time)."""
    from areal_hpc.config.load import load_config
    from areal_hpc.data.warm_start import ensure_prepared

    return ensure_prepared(load_config(CONFIG))
