"""Reading and writing Hugging Face model directories, one tensor at a time.

Reading is lazy (safetensors `safe_open`), so a trainer rank loads only the tensors its own shards
need and never the whole model. Writing takes the tensors of one pipeline stage at a time; an index
then names the file of every tensor, as transformers and vLLM expect of a sharded checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from areal_hpc.config.hf import hf_config_dict
from areal_hpc.config.schema import ModelConfig
from areal_hpc.trainer.convert import hf_shapes, ignorable
from areal_hpc.trainer.errors import WeightsError

INDEX = "model.safetensors.index.json"
# Files of a model directory that are not tokenizer files.
_MODEL_FILES = ("config.json", INDEX)


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class HFCheckpoint:
    """The tensors of a Hugging Face directory (one model.safetensors, or shards with an index)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.path / file for name, file in weight_map.items()}
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"{self.path}: no *.safetensors files (not a Hugging Face checkpoint)")
            self.files = {}
            for file in files:
                with safe_open(file, framework="pt") as f:
                    self.files.update(dict.fromkeys(f.keys(), file))
        self._open: dict[Path, object] = {}

    def _handle(self, name: str):
        file = self.files[name]
        if file not in self._open:
            if not file.is_file():
                raise WeightsError(f"{file}: listed in {INDEX} for {name} but missing")
            self._open[file] = safe_open(file, framework="pt")
        return self._open[file]

    def names(self) -> list[str]:
        return sorted(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def check(self, m: ModelConfig) -> None:
        """Raise WeightsError naming every missing, unexpected and mis-shaped tensor."""
        want = hf_shapes(m)
        have = set(self.files)
        missing = sorted(set(want) - have)
        unexpected = sorted(n for n in have - set(want) if not ignorable(m, n))
        wrong = [
            f"{n} {list(self.shape(n))} (expected {list(want[n])})"
            for n in sorted(have & set(want)) if self.shape(n) != want[n]
        ]
        problems = []
        if missing:
            problems.append(f"missing tensors: {_listing(missing)}")
        if unexpected:
            problems.append(f"unexpected tensors: {_listing(unexpected)}")
        if wrong:
            problems.append(f"wrong shapes: {_listing(wrong)}")
        if problems:
            raise WeightsError(f"{self.path}: " + "; ".join(problems))


def write_tensors(path: Path, filename: str, tensors: dict[str, torch.Tensor]) -> None:
    save_file({n: t.detach().contiguous().cpu() for n, t in tensors.items()}, str(path / filename),
              metadata={"format": "pt"})


def write_index(path: Path, weight_map: dict[str, str], total_bytes: int) -> None:
    index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (path / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def write_config(path: Path, m: ModelConfig, dtype: torch.dtype, token_ids: dict[str, int]) -> None:
    torch_dtype = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(hf_config_dict(m, torch_dtype, **token_ids), indent=2) + "\n")


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Every file of `src` except weights and model config (tokenizer, generation config...)."""
    for file in src.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in _MODEL_FILES:
            shutil.copy2(file, dst / file.name)
