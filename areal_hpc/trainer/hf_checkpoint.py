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
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from areal_hpc.config.hf import FAMILIES, hf_config_dict
from areal_hpc.config.schema import ModelConfig
from areal_hpc.errors import listed
from areal_hpc.trainer.convert import hf_shapes, ignorable
from areal_hpc.trainer.errors import WeightsError

INDEX = "model.safetensors.index.json"
GENERATION_CONFIG = "generation_config.json"
# Name prefixes of the tokenizer files of a model directory (fast and slow tokenizers, chat
# templates); weights, configs, READMEs and licences are left behind.
_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab.", "merges.", "chat_template")
# The special token ids an export keeps; sampling defaults (temperature, top_p...) are left out.
_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
# Names listed in full in an error before the rest are counted.
_LISTED = 8


class HFCheckpoint:
    """The tensors of a Hugging Face directory (one model.safetensors, or shards with an index)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                self.files = {str(name): self.path / str(file) for name, file in weight_map.items()}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise WeightsError(f"{index}: not a readable safetensors index (expected {{\"weight_map\":"
                                   f" {{tensor name: file}}}}; {type(e).__name__}: {e})") from None
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"{self.path}: no *.safetensors files (not a Hugging Face checkpoint)")
            self.files = {}
            for file in files:
                with _opened(file) as f:
                    self.files.update(dict.fromkeys(f.keys(), file))
        self._open: dict[Path, object] = {}

    def _handle(self, name: str):
        file = self.files[name]
        if file not in self._open:
            if not file.is_file():
                raise WeightsError(f"{file}: listed in {INDEX} for {name} but missing")
            self._open[file] = _opened(file)
        return self._open[file]

    def names(self) -> list[str]:
        return sorted(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        try:
            return tuple(self._handle(name).get_slice(name).get_shape())
        except SafetensorError as e:  # the index names a file that does not hold the tensor
            raise WeightsError(f"{self.files[name]}: {name}: {e}") from None

    def get(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def check(self, m: ModelConfig) -> None:
        """Raise WeightsError naming every missing, unexpected and mis-shaped tensor of the
        family's layout (trainer/convert.py hf_shapes)."""
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
            problems.append(f"missing tensors: {listed(missing, _LISTED)}")
        if unexpected:
            problems.append(f"unexpected tensors: {listed(unexpected, _LISTED)}")
        if wrong:
            problems.append(f"wrong shapes: {listed(wrong, _LISTED)}")
        if problems:
            expected = f"{FAMILIES[m.family].architecture} of its config.json's shape"
            raise WeightsError(f"{self.path}: the tensors are not those of a {expected}: " + "; ".join(problems))


def _opened(file: Path):
    """safe_open of `file` (its header is read and checked against the file's size); a file that
    is not whole safetensors is a WeightsError naming it."""
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise WeightsError(f"{file}: not a readable safetensors file ({e}): truncated, or not safetensors")\
            from None


def write_tensors(path: Path, filename: str, tensors: dict[str, torch.Tensor]) -> None:
    save_file({n: t.detach().contiguous().cpu() for n, t in tensors.items()}, str(path / filename),
              metadata={"format": "pt"})


def write_index(path: Path, weight_map: dict[str, str], total_bytes: int) -> None:
    index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (path / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def read_token_ids(model_dir: Path) -> dict[str, int | list[int]]:
    """bos/eos/pad ids of a Hugging Face directory: generation_config.json's, else config.json's
    (eos may be a list: chat models stop on any of them)."""
    ids: dict[str, int | list[int]] = {}
    for name in ("config.json", GENERATION_CONFIG):  # the generation config wins
        file = model_dir / name
        if file.is_file():
            data = json.loads(file.read_text())
            ids.update({k: data[k] for k in _TOKEN_KEYS if data.get(k) is not None})
    return ids


def write_generation_config(path: Path, token_ids: dict[str, int | list[int]]) -> None:
    """Token ids only: the run's rollout.temperature is a training setting, not the model's
    default, so generation uses the library's defaults unless the caller sets its own."""
    (path / GENERATION_CONFIG).write_text(json.dumps(token_ids, indent=2) + "\n")


def write_config(path: Path, m: ModelConfig, dtype: torch.dtype, token_ids: dict[str, int | list[int]]) -> None:
    """config.json (config/hf.py); a list of eos ids names its first, as Qwen's checkpoints do."""
    torch_dtype = str(dtype).removeprefix("torch.")
    ids = {k: v[0] if isinstance(v, list) else v for k, v in token_ids.items() if k != "pad_token_id"}
    (path / "config.json").write_text(json.dumps(hf_config_dict(m, torch_dtype, **ids), indent=2) + "\n")


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files of `src` (not its weights, configs or anything else)."""
    for file in src.iterdir():
        if file.is_file() and file.name.startswith(_TOKENIZER_FILES):
            shutil.copy2(file, dst / file.name)


def write_tokenizer(dst: Path, tokenizer_dir: Path, model_dir: Path) -> None:
    """`tokenizer_dir`'s tokenizer files and `model_dir`'s special token ids (as
    generation_config.json) in `dst`: what a Hugging Face export takes besides the weights."""
    dst.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(tokenizer_dir, dst)
    write_generation_config(dst, read_token_ids(model_dir))


def write_model_files(path: Path, m: ModelConfig, dtype: torch.dtype, token_ids: dict[str, int | list[int]],
                      tokenizer_dir: Path | None) -> None:
    """Everything of a Hugging Face directory but the weights: config.json,
    generation_config.json and the tokenizer files."""
    write_config(path, m, dtype, token_ids)
    write_generation_config(path, token_ids)
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, path)
