"""WordPiece vocabularies for the text tower, learned with tensorflow-text's BERT vocab tools.

A vocabulary is a list of tokens, one per line; line number = token id. It starts with the BERT special tokens
``[PAD]`` (id 0), ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``, followed by the tokens that
``tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset`` learns from a corpus after the same
normalisation ``tensorflow_text.BertTokenizer(vocab, lower_case=True)`` applies (case folding, accent
stripping, punctuation splitting), so a tokenizer built from the file sees exactly the words it was learned on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:
    import tensorflow_text as tf_text

from ce_retrieval.utils.atomic import atomic_write_text
from ce_retrieval.utils.autograph_rules import leave_graph_ready_libraries_unconverted

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # looked up by name by the tokenizer and the BERT packer
TOKENIZER_PARAMS = {"lower_case": True}


def build_vocab(corpus: Iterable[str] | tf.data.Dataset, vocab_size: int = 8000, batch_size: int = 1024) -> list[str]:
    """Learn a WordPiece vocabulary of at most ``vocab_size`` tokens (specials included) from ``corpus``."""
    from tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset import bert_vocab_from_dataset

    leave_graph_ready_libraries_unconverted()
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
        raise RuntimeError(f"special tokens were not placed first: {vocab[: len(RESERVED_TOKENS)]}")
    return list(vocab)


def write_vocab(vocab: list[str], path: str) -> str:
    """Write one token per line (UTF-8), atomically; the parent folder is created. Returns ``path``."""
    atomic_write_text(path, "".join(token + "\n" for token in vocab))
    return path


def read_vocab(path: str) -> list[str]:
    """The tokens of a WordPiece vocab file (line number = token id), validated; the one reader of vocab files
    (the data pipeline's and the text tower's).

    The rule: lines are read with ``tf.io.gfile`` (local or remote paths) and stripped of ``\\n`` / ``\\r\\n``
    line ends (as the tower's ``tf.lookup.TextFileInitializer`` reads them); an empty line is an error (that
    initializer refuses one, a blank last line included).
    The tokens the tokenizer and the BERT packer look up by name, :data:`REQUIRED_TOKENS` (``[PAD] [UNK] [CLS]
    [SEP]``), must be present, anywhere: a vocab built here starts with :data:`RESERVED_TOKENS`, a pretrained
    BERT ``vocab.txt`` (TF-Hub exports, Model Garden checkpoints) has ``[PAD]`` at 0 and ``[UNK] [CLS] [SEP]``
    after its ``[unusedN]`` tokens, and both are valid. Tokens must be unique (a repeated one would map two ids
    to one string). Raises ``FileNotFoundError`` for a missing file, ``ValueError`` otherwise.
    """
    if not path or not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"WordPiece vocab file not found: {path!r}")
    with tf.io.gfile.GFile(path, "r") as f:
        vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    empty = [i + 1 for i, token in enumerate(vocab) if not token]
    if empty:
        raise ValueError(f"{path}: empty line(s) {empty[:5]} in vocab (a token per line, no blank lines)")
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise ValueError(
            f"{path}: lacks the special tokens {missing}; a vocab must start with {RESERVED_TOKENS} (as one built by "
            f"build_vocab does) or at least contain {REQUIRED_TOKENS} (as a pretrained BERT vocab.txt does)"
        )
    if len(set(vocab)) != len(vocab):
        raise ValueError(f"{path}: duplicate tokens in vocab")
    return vocab


def tokenizer(vocab_path: str) -> tf_text.BertTokenizer:
    """The matching ``tensorflow_text.BertTokenizer`` (lower_case=True, [UNK] for out-of-vocab words)."""
    import tensorflow_text as tf_text

    leave_graph_ready_libraries_unconverted()
    return tf_text.BertTokenizer(vocab_path, token_out_type=tf.int64, unknown_token="[UNK]", **TOKENIZER_PARAMS)
