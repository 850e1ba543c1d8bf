"""Prompt data: the synthetic arithmetic task, its tokenizer and tiny model, and data-set loading."""
