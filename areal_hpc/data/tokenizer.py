"""Train a byte-level BPE tokenizer on local text and save it as a Hugging Face tokenizer.

No model hub is reachable from CI, so the CPU profile trains its own tokenizer on the synthetic
task; transformers and vLLM load the result like any other checkpoint's tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path) -> None:
    """Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(str(out_dir))
