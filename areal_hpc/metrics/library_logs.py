"""Quieting the libraries whose INFO output and import-time warnings drown a run's own lines: the
one copy of these settings, for the ranks of a run and for the evaluation engines."""

from __future__ import annotations

import logging
import os
import warnings

# Libraries whose INFO output and import-time warnings are shown at DEBUG only.
QUIET = ("megatron", "torch.distributed", "vllm", "transformers")
# Loggers whose only warning says that triton, which the CPU profile leaves out, is absent.
SILENT = ("torch._library.triton",)


def quiet_libraries() -> None:
    """Their loggers at WARNING, their warnings ignored; vLLM's own processes (which read
    VLLM_LOGGING_LEVEL) and torch's C++ notices (TORCH_CPP_LOG_LEVEL: vLLM's CPU worker announces
    its NUMA binding) at ERROR unless the environment already says otherwise. Hugging Face's
    progress bars (a bar per model save and load, read when transformers is imported) are off."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
