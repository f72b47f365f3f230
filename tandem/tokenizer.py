"""The one way every part of Tandem loads the run's tokenizer (controller and services alike).

A tokenizer without a pad token pads with its EOS token, as verl does (Llama's tokenizers have
none); everything else is the tokenizer as Hugging Face saved it. Checks that it is usable at all
(files, vocabulary, EOS, ids within the model) run at config load: tandem/config/checks/files.py.
"""
from __future__ import annotations


def load_tokenizer(path: str):
    """AutoTokenizer from a local directory, pad token defaulting to EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok
