"""`areal-hpc export-hf CHECKPOINT_DIR --out DIR`: a trainer checkpoint as a Hugging Face directory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-hf", help="export a checkpoint (step-N directory, any trainer layout) as a Hugging Face model",
        description="Reads one tensor at a time in one process (no GPU, no process group) and writes"
                    " config.json, generation_config.json, the tokenizer and ~2 GiB safetensors shards,"
                    " which transformers and vLLM load as they are.")
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a complete checkpoint, e.g. RUN/checkpoints/step-00000100")
    p.add_argument("--out", required=True, help="the new Hugging Face directory (must not exist or be empty)")
    p.add_argument("--dtype", default=None, help="bf16, fp16 or fp32 (default: that of the trained weights)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="take the tokenizer files from DIR (default: the copy saved with the checkpoint)")
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from areal_hpc.trainer.dist_to_hf import export  # torch: only for this command

    out = export(args.checkpoint, args.out, args.dtype, args.tokenizer)
    print(out)
    return 0
