"""WordPiece vocabularies for the text tower, learned with tensorflow-text's BERT vocab tools.

A vocabulary is a list of tokens, one per line; line number = token id. It starts with the BERT special tokens
``[PAD]`` (id 0), ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``, followed by the tokens that
``tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset`` learns from a corpus after the same
normalisation ``tensorflow_text.BertTokenizer(vocab, lower_case=True)`` applies (case folding, accent
stripping, punctuation splitting), so a tokenizer built from the file sees exactly the words it was learned on.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

import tensorflow as tf

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_PARAMS = {"lower_case": True}


def build_vocab(corpus: Iterable[str] | tf.data.Dataset, vocab_size: int = 8000, batch_size: int = 1024) -> list[str]:
    """Learn a WordPiece vocabulary of at most ``vocab_size`` tokens (specials included) from ``corpus``."""
    from tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset import bert_vocab_from_dataset

    if vocab_size <= len(RESERVED_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(RESERVED_TOKENS)} special tokens, got {vocab_size}")
    if isinstance(corpus, tf.data.Dataset):
        dataset = corpus
    else:
        texts = [str(t) for t in corpus]
        if not texts:
            raise ValueError("build_vocab: the corpus is empty")
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))
    vocab = bert_vocab_from_dataset(
        dataset.batch(batch_size).prefetch(2),
        vocab_size=vocab_size,
        reserved_tokens=list(RESERVED_TOKENS),
        bert_tokenizer_params=TOKENIZER_PARAMS,
        learn_params={},
    )
    if list(vocab[: len(RESERVED_TOKENS)]) != list(RESERVED_TOKENS):
        raise RuntimeError(f"special tokens were not placed first: {vocab[:len(RESERVED_TOKENS)]}")
    return list(vocab)


def write_vocab(vocab: list[str], path: str) -> str:
    """Write one token per line (UTF-8); the parent folder is created. Returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token in vocab)
    os.replace(tmp, path)
    return path


def read_vocab(path: str) -> list[str]:
    """Tokens of a vocab file, validated to start with the BERT special tokens."""
    with open(path, encoding="utf-8") as f:
        vocab = [line.rstrip("\n") for line in f]
    if vocab[: len(RESERVED_TOKENS)] != list(RESERVED_TOKENS):
        raise ValueError(f"{path}: a vocab must start with {RESERVED_TOKENS}, got {vocab[:len(RESERVED_TOKENS)]}")
    if len(set(vocab)) != len(vocab):
        raise ValueError(f"{path}: duplicate tokens in vocab")
    return vocab


def tokenizer(vocab_path: str):
    """The matching ``tensorflow_text.BertTokenizer`` (lower_case=True, [UNK] for out-of-vocab words)."""
    import tensorflow_text as tf_text

    return tf_text.BertTokenizer(vocab_path, token_out_type=tf.int64, unknown_token="[UNK]", **TOKENIZER_PARAMS)
