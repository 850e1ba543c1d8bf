"""Benchmark scripts loaded as modules, for tests of their pure parts without running them."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path("benchmarks")


@contextmanager
def loaded(name: str) -> Iterator[ModuleType]:
    """benchmarks/NAME.py as module NAME: registered while it loads (dataclasses look their module
    up then), its siblings importable (rl_runs), both undone afterwards."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCHMARKS))
