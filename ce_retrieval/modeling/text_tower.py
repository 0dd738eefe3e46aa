"""Text tower: raw UTF-8 captions -> WordPiece ids (in the graph) -> BERT -> [CLS] -> W x -> x / ||x||.

    e_text = normalize(W h_[CLS]),   h = BERT(pack([CLS] wordpiece(caption)[:L-2] [SEP]), L = 32),  W in R^{d x H}

as in Veit & Wilber (2020) §4.1: the 768-d [CLS] vector of BERT-base, reduced to d = 128 "without any bias or
activation". Tokenisation runs inside the graph (tensorflow-text ``BertTokenizer`` + Model Garden's packing), so
the exported encoder takes raw strings and needs ``import tensorflow_text`` wherever it is loaded.

The tower is built as three Keras objects sharing weights (see :class:`Tower`): the ``preprocessor`` (strings ->
int32 ``input_word_ids / input_mask / input_type_ids`` [B, L]), the ``core`` (that dict -> unit embeddings,
the XLA-compilable part) and the ``encoder`` (strings -> embeddings = core(preprocessor(strings))).
"""

from __future__ import annotations

import os
import typing

import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras
from official.nlp.modeling import layers as nlp_layers
from official.nlp.modeling import networks

from ce_retrieval.data.vocab import read_vocab
from ce_retrieval.modeling.config import PROJECTION_NORMS, TextTowerConfig
from ce_retrieval.modeling.layers import L2Normalize, as_string_batch
from ce_retrieval.utils.autograph_rules import leave_graph_ready_libraries_unconverted

SPECIAL_TOKENS = {"start_of_sequence_id": "[CLS]", "end_of_segment_id": "[SEP]", "padding_id": "[PAD]"}
BERT_INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


class Tower(typing.NamedTuple):
    """One tower as three weight-sharing parts: raw input -> preprocessor -> core -> unit embedding."""

    preprocessor: tf_keras.layers.Layer
    core: tf_keras.Model
    encoder: tf_keras.Model

    @classmethod
    def assemble(
        cls,
        preprocessor,
        inputs,
        features,
        embedding_dim: int,
        prefix: str,
        raw_input: str,
        projection_norm: str = "none",
    ) -> Tower:
        """The head both towers share (§4.1): ``features`` projected to ``embedding_dim`` without bias or
        activation, then L2-normalised (layers ``{prefix}_projection``, ``{prefix}_embedding``); ``core``
        (``{prefix}_core``) maps ``inputs`` to the embedding, ``encoder`` (``{prefix}_encoder``) a raw tf.string
        batch (input ``raw_input``) through ``preprocessor`` and ``core``.

        ``projection_norm='batchnorm'`` standardises the features before the projection (layer
        ``{prefix}_projection_norm``: ``(h - mean_B h) / sqrt(var_B h + eps)`` per feature, batch statistics in
        training, moving ones when served; no learned offset or gain, which the projection would absorb).
        ReLU-pooled image features and mean-pooled BERT states share a large common component, so from
        random initialisation every embedding of a tower points nearly the same way; centring removes it."""
        if projection_norm == "batchnorm":
            features = tf_keras.layers.BatchNormalization(center=False, scale=False, name=f"{prefix}_projection_norm")(
                features
            )
        elif projection_norm not in PROJECTION_NORMS:
            raise ValueError(f"projection_norm must be one of {list(PROJECTION_NORMS)}, got {projection_norm!r}")
        projected = tf_keras.layers.Dense(embedding_dim, use_bias=False, name=f"{prefix}_projection")(features)
        embedding = L2Normalize(name=f"{prefix}_embedding")(projected)
        core = tf_keras.Model(inputs, embedding, name=f"{prefix}_core")
        raw = tf_keras.Input(shape=(), dtype=tf.string, name=raw_input)
        encoder = tf_keras.Model(raw, core(preprocessor(raw)), name=f"{prefix}_encoder")
        return cls(preprocessor, core, encoder)


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class TextPreprocessor(tf_keras.layers.Layer):
    """Raw strings [B] -> BERT inputs: WordPiece (lower-cased), truncated to ``seq_length - 2``, packed as
    ``[CLS] tokens [SEP] [PAD]...``; returns int32 ``input_word_ids``, ``input_mask``, ``input_type_ids`` [B, L]."""

    def __init__(self, vocab_file: str, seq_length: int = 32, lower_case: bool = True, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.vocab_file = vocab_file
        self.seq_length = int(seq_length)
        self.lower_case = bool(lower_case)
        tokens = read_vocab(vocab_file)
        self.vocab_size = len(tokens)
        self.special_ids = {key: tokens.index(tok) for key, tok in SPECIAL_TOKENS.items()}
        initializer = tf.lookup.TextFileInitializer(
            vocab_file,
            key_dtype=tf.string,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
        )
        self._table = tf.lookup.StaticHashTable(initializer, default_value=-1)
        self._tokenizer = tf_text.BertTokenizer(self._table, lower_case=self.lower_case, token_out_type=tf.int64)

    def call(self, inputs) -> dict[str, tf.Tensor]:
        strings = as_string_batch(inputs, "TextPreprocessor", "captions")
        batch_size = tf.shape(strings)[0]
        pieces = self._tokenizer.tokenize(strings)  # [B, (words), (pieces)] int64
        # Reshape row splits to a static batch size (works around ragged shape inference in Keras graphs).
        pieces = pieces.merge_dims(1, -1)
        pieces = tf.RaggedTensor.from_row_splits(
            tf.cast(pieces.values, tf.int32), tf.reshape(pieces.row_splits, [batch_size + 1])
        )
        packed = nlp_layers.BertPackInputs.bert_pack_inputs(
            [pieces], self.seq_length, truncator="waterfall", **self.special_ids
        )
        return {
            key: tf.ensure_shape(tf.cast(packed[key], tf.int32), [None, self.seq_length]) for key in BERT_INPUT_KEYS
        }

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "vocab_file": self.vocab_file,
            "seq_length": self.seq_length,
            "lower_case": self.lower_case,
        }


def _pool(outputs, input_mask, pooling: str, where: str):
    """The caption vector from the encoder outputs: [CLS] of the last layer, BERT's pooler, or a masked mean."""
    if not isinstance(outputs, dict):
        raise TypeError(f"{where}: the text encoder must return a dict with 'sequence_output' / 'pooled_output'")
    key = "pooled_output" if pooling == "pooled" else "sequence_output"
    if key not in outputs:
        raise KeyError(f"{where}: encoder outputs have no {key!r} (keys: {sorted(outputs)})")
    if pooling == "pooled":
        return outputs[key]
    sequence = outputs[key]
    if pooling == "cls":
        return sequence[:, 0, :]
    mask = tf.cast(input_mask, sequence.dtype)[:, :, None]
    return tf.reduce_sum(sequence * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)


def build_bert_encoder(cfg: TextTowerConfig, vocab_size: int) -> tf_keras.layers.Layer:
    """Model Garden ``BertEncoderV2`` of the configured size, restored from ``cfg.init_checkpoint`` if set."""
    if cfg.max_seq_length > cfg.max_position_embeddings:
        raise ValueError(
            f"text.max_seq_length ({cfg.max_seq_length}) exceeds text.max_position_embeddings "
            f"({cfg.max_position_embeddings})"
        )
    encoder = networks.BertEncoderV2(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        inner_dim=cfg.intermediate_size,
        inner_activation=tf_keras.activations.get(cfg.hidden_activation)
        if cfg.hidden_activation != "gelu"
        else (lambda x: tf_keras.activations.gelu(x, approximate=True)),
        output_dropout=cfg.dropout_rate,
        attention_dropout=cfg.attention_dropout_rate,
        max_sequence_length=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        name="bert_encoder",
    )
    if cfg.init_checkpoint:
        dummy = tf.zeros([1, cfg.max_seq_length], tf.int32)
        encoder(dict(input_word_ids=dummy, input_mask=tf.ones_like(dummy), input_type_ids=dummy))
        path = cfg.init_checkpoint
        if tf.io.gfile.isdir(path):
            path = tf.train.latest_checkpoint(path)
            if path is None:
                raise FileNotFoundError(f"text.init_checkpoint: no checkpoint in directory {cfg.init_checkpoint!r}")
        status = tf.train.Checkpoint(encoder=encoder).read(path)
        status.expect_partial().assert_existing_objects_matched()
    return encoder


def build_hub_encoder(cfg: TextTowerConfig) -> tf_keras.layers.Layer:
    """``hub.KerasLayer`` for a TF-Hub URL or a local SavedModel directory with BERT dict inputs/outputs."""
    hub = import_tensorflow_hub()
    return hub.KerasLayer(cfg.hub_handle, trainable=cfg.trainable, name="hub_text_encoder")


def import_tensorflow_hub():
    """``import tensorflow_hub``, working around its import-time use of ``pkg_resources``.

    tensorflow-hub 0.16.1 calls ``pkg_resources.parse_version`` once, to check the TensorFlow version, and
    setuptools >= 81 no longer ships ``pkg_resources``. If it is missing, a one-function stand-in backed by
    ``packaging.version.parse`` is registered for that check (pinning ``setuptools<81`` makes this a no-op).
    """
    import sys

    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        import types

        from packaging.version import parse

        sys.modules["pkg_resources"] = types.SimpleNamespace(parse_version=parse)
        try:
            import tensorflow_hub as hub
        finally:
            del sys.modules["pkg_resources"]
        return hub
    import tensorflow_hub as hub

    return hub


def default_hub_vocab(handle: str) -> str | None:
    """``<handle>/assets/vocab.txt`` for a local SavedModel that ships its vocab (TF-Hub BERT exports do)."""
    path = os.path.join(handle, "assets", "vocab.txt")
    return path if tf.io.gfile.exists(path) else None


def build_text_tower(
    cfg: TextTowerConfig, embedding_dim: int, vocab_path: str | None, projection_norm: str = "none"
) -> Tower:
    """Builds the text :class:`Tower` (preprocessor, core, encoder) for ``cfg``."""
    leave_graph_ready_libraries_unconverted()
    if vocab_path is None and cfg.kind == "hub":
        vocab_path = default_hub_vocab(cfg.hub_handle)
    if vocab_path is None:
        raise ValueError("text tower: a WordPiece vocab file is required (vocab_path=None)")
    preprocessor = TextPreprocessor(vocab_path, cfg.max_seq_length, cfg.lower_case, name="text_preprocessor")

    encoder_layer = build_bert_encoder(cfg, preprocessor.vocab_size) if cfg.kind == "bert" else build_hub_encoder(cfg)
    encoder_layer.trainable = cfg.trainable
    if cfg.kind == "bert" and cfg.pooling != "pooled":
        encoder_layer.pooler_layer.trainable = False  # the tanh pooler is unused: no gradient reaches it
    inputs = {key: tf_keras.Input(shape=(cfg.max_seq_length,), dtype=tf.int32, name=key) for key in BERT_INPUT_KEYS}
    pooled = _pool(encoder_layer(inputs), inputs["input_mask"], cfg.pooling, "text tower")
    return Tower.assemble(
        preprocessor, inputs, pooled, embedding_dim, prefix="text", raw_input="caption", projection_norm=projection_norm
    )


__all__ = ["TextPreprocessor", "Tower", "build_text_tower"]
