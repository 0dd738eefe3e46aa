"""WordPiece vocabularies for the text tower, built from a caption corpus with tensorflow-text's tools.

The vocab starts with BERT's special tokens ([PAD] = 0, [UNK], [CLS], [SEP], [MASK]) and is lower-cased the way
``tensorflow_text.BertTokenizer(lower_case=True)`` normalises text, so the in-graph tokenizer of the text tower
maps the corpus to few [UNK] tokens.
"""
from __future__ import annotations

import os

RESERVED_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_wordpiece_vocab(captions, vocab_size: int = 8000) -> list[str]:
    """A WordPiece vocab learned from ``captions`` (``tensorflow_text`` ``bert_vocab_from_dataset``)."""
    import tensorflow as tf
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

    captions = [c for c in captions if c and c.strip()]
    if not captions:
        raise ValueError("cannot build a vocab from an empty corpus")
    dataset = tf.data.Dataset.from_tensor_slices(captions).batch(1024)
    vocab = bert_vocab.bert_vocab_from_dataset(
        dataset,
        vocab_size=vocab_size,
        reserved_tokens=RESERVED_TOKENS,
        bert_tokenizer_params={"lower_case": True},
        learn_params={},
    )
    return list(vocab)


def write_vocab(tokens: list[str], path: str) -> str:
    """Writes one token per line atomically; returns ``path``."""
    from ce_retrieval.utils.atomic import atomic_write_text

    if not tokens or tokens[0] != "[PAD]":
        raise ValueError("a BERT vocab must start with [PAD] (id 0)")
    atomic_write_text(path, "\n".join(tokens) + "\n")
    return path


def read_vocab(path: str) -> list[str]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"vocab file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f if line.strip()]
    missing = [t for t in RESERVED_TOKENS[:4] if t not in tokens]
    if missing:
        raise ValueError(f"vocab file {path} lacks the special tokens {missing}")
    return tokens
