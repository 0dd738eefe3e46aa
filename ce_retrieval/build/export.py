"""Export the two towers as TF Serving SavedModels (used by the ``ce-retrieval export`` command).

Each tower becomes one SavedModel in TF Serving's layout, ``<export_dir>/<tower>/<version>/``, with two named
signatures that compute the same thing:

    text_encoder:  serving_default, embed_text   text: string[B] (raw UTF-8)           -> embedding: float32[B, d]
    image_encoder: serving_default, embed_image  image_bytes: string[B] (JPEG/PNG)     -> embedding: float32[B, d]

Tokenisation and image decoding/resizing run inside the graph (they are part of the towers), so clients send
raw strings and bytes. Outputs are ``l2_normalize(float32(tower(x)))``: unit vectors whose dot product is the
cosine similarity s(q, d) the model was trained on (the logit is ``logit_scale * s + logit_bias``, the bias
only for a loss that has one, e.g. SigLIP's: ``sigmoid(logit)`` is then its probability of relevance). The input name
``image_bytes`` ends in ``_bytes`` so that TF Serving's REST API accepts ``{"b64": ...}`` values for it.

Every version carries ``assets.extra/ce_retrieval_export.json`` (TF Serving ignores it): a fingerprint of the
weights (SHA-256 over every weight tensor of both towers), embeddings of fixed probe inputs (used to check a
reloaded model and to bind an index to its model), the custom ops the graph needs (e.g. TF-Text's
``CaseFoldUTF8``: a TF Serving build must link them), and caller metadata. Writing is atomic (see ``layout``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import os
import uuid
from collections.abc import Callable

import numpy as np

import ce_retrieval
from ce_retrieval.search import layout
from ce_retrieval.utils import atomic

PROBE_TEXTS = ("a dog runs along the beach", "two people ride bicycles in a city street", "ce_retrieval probe 0123")
TEXT_INPUT, IMAGE_INPUT, OUTPUT = "text", "image_bytes", "embedding"
TEXT_SIGNATURES = ("serving_default", "embed_text")
IMAGE_SIGNATURES = ("serving_default", "embed_image")
PROBE_ATOL = 1e-5


@dataclasses.dataclass(frozen=True)
class ExportPaths:
    version: int
    text_encoder: str
    image_encoder: str
    metadata: dict


def probe_images(num: int = 3, size: int = 32) -> list[bytes]:
    """Deterministic PNG probes (gradients + a fixed-seed pattern), identical on every machine."""
    from PIL import Image

    rng = np.random.default_rng(20201117)
    yy, xx = np.mgrid[0:size, 0:size]
    out = []
    for i in range(num):
        img = np.stack([(xx * (7 + i)) % 256, (yy * (5 + 2 * i)) % 256, rng.integers(0, 256, (size, size))], -1)
        buf = io.BytesIO()
        Image.fromarray(img.astype(np.uint8), "RGB").save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def weights_fingerprint(model) -> str:
    """SHA-256 over dtype, shape and bytes of every weight (trainable or not) in the model's weight order."""
    h = hashlib.sha256()
    for w in model.weights:
        value = np.asarray(w.numpy())
        h.update(f"{value.dtype}:{value.shape};".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


def _servable(encoder, input_name: str):
    """A ``tf.Module`` with one traced function ``embed(<input_name>: string[B]) -> {"embedding": float32[B,d]}``."""
    import tensorflow as tf

    spec = tf.TensorSpec([None], tf.string, name=input_name)

    def _embed(x):
        emb = encoder(x, training=False)
        return {OUTPUT: tf.math.l2_normalize(tf.cast(emb, tf.float32), axis=-1)}

    # The argument name becomes the signature's input key, so build the function with the wanted name.
    if input_name == TEXT_INPUT:

        def embed(text):
            return _embed(text)
    else:

        def embed(image_bytes):
            return _embed(image_bytes)

    module = tf.Module(name=f"{input_name}_servable")
    module.encoder = encoder  # tracks the variables and assets (e.g. vocabulary files) of the tower
    module.embed = tf.function(embed, input_signature=[spec])
    return module


def _without_keras_traces():
    """Saving without Keras's own serialisation of every layer's call function (tf_keras's ``save_traces=False``).

    A served tower is called through the signatures alone; tracing each Keras layer's ``call`` for the SavedModel's
    Keras metadata (what ``tf_keras.models.load_model`` would revive) took about two thirds of ``tf.saved_model.save``
    for the demo's towers (16 of 24 s). The variables, assets and lookup tables are still tracked through the
    tower. Without tf_keras (Keras 3 only) there are no such traces to skip."""
    try:
        from tf_keras.src.saving.legacy.saved_model import utils as keras_saving
    except ImportError:  # pragma: no cover - every supported environment installs tf_keras
        return contextlib.nullcontext()
    return keras_saving.keras_option_scope(save_traces=False, in_tf_saved_model_scope=True)


def embed_with_keras(encoder, inputs) -> np.ndarray:
    """Embeddings from an in-memory tower, normalised exactly like the exported signature."""
    import tensorflow as tf

    emb = encoder(tf.constant(list(inputs), dtype=tf.string), training=False)
    return tf.math.l2_normalize(tf.cast(emb, tf.float32), axis=-1).numpy()


def _saved_model_proto(saved_model_dir: str):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def graph_functions(saved_model_dir: str) -> list[str]:
    """The names of the functions in a SavedModel's graph library (traced signatures and what they call; with
    Keras's traces, also every layer's ``..._layer_call_...`` functions, which :func:`export_encoders` leaves out)."""
    return _function_names(_saved_model_proto(saved_model_dir))


def _function_names(proto) -> list[str]:
    return [fn.signature.name for mg in proto.meta_graphs for fn in mg.graph_def.library.function]


def custom_ops(saved_model_dir: str) -> list[str]:
    """Ops used by a SavedModel's graph that core TensorFlow does not register (e.g. TF-Text's tokenizers).

    A TF Serving binary must be built with (or load) these ops, or loading the model fails with
    ``Op type not registered``.
    """
    import tensorflow as tf

    proto = _saved_model_proto(saved_model_dir)
    used = set()
    for meta_graph in proto.meta_graphs:
        used.update(node.op for node in meta_graph.graph_def.node)
        for fn in meta_graph.graph_def.library.function:
            used.update(node.op for node in fn.node_def)
    function_names = set(_function_names(proto))
    return sorted(op for op in used if op not in function_names and not hasattr(tf.raw_ops, op))


def import_custom_op_libraries() -> None:
    """Registers TF-Text's ops (the towers' tokenisers) so SavedModels that use them can be loaded."""
    try:
        import tensorflow_text  # noqa: F401
    except ImportError:  # a model without TF-Text ops still loads; one with them fails with a clear TF error
        pass


def load_signature(saved_model_dir: str, name: str = "serving_default") -> tuple[object, Callable]:
    """Loads a SavedModel (TF-Text ops registered first) and returns ``(loaded, signature)``."""
    import tensorflow as tf

    import_custom_op_libraries()
    loaded = tf.saved_model.load(saved_model_dir)
    if name not in loaded.signatures:
        raise KeyError(f"{saved_model_dir} has no signature {name!r}; it has {sorted(loaded.signatures)}")
    return loaded, loaded.signatures[name]


def _check_probes(saved_model_dir: str, input_name: str, inputs, expected: np.ndarray) -> None:
    import tensorflow as tf

    _, fn = load_signature(saved_model_dir)
    got = fn(**{input_name: tf.constant(list(inputs), dtype=tf.string)})[OUTPUT].numpy()
    err = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else float("inf")
    if not err <= PROBE_ATOL:
        raise RuntimeError(
            f"exported {os.path.basename(os.path.dirname(saved_model_dir))} does not reproduce the "
            f"Keras tower (max |diff| {err:.3g} > {PROBE_ATOL}); export aborted"
        )


#: the model's scalars that turn a cosine into a logit (``λ·s + b``); each is a manifest field
SCORING_PARAMETERS = ("logit_scale", "logit_bias")


def scoring_parameters(model) -> dict[str, float]:
    """The scoring parameters of a two-tower ``model`` read from the model itself, e.g.
    ``{"logit_scale": λ, "logit_bias": b}`` for ``l = λ·cos + b``: the learned values when the model learns them,
    never the configured initial ones. A parameter the model does not have is left out (the manifest then
    records None)."""
    out = {}
    for name in SCORING_PARAMETERS:
        value = getattr(model, name, None)
        if value is not None:
            out[name] = float(np.asarray(value))
    return out


def export_model(
    model, export_dir: str, version: int | None = None, metadata: dict | None = None, *, verify: bool = True
) -> ExportPaths:
    """Both towers of a trained two-tower ``model`` (``model.text_encoder`` / ``.image_encoder``) with its
    :func:`scoring_parameters`, as :func:`export_encoders` writes them: what ``ce-retrieval export`` and
    ``ce-retrieval demo`` publish, so the two commands write the same manifest for the same model."""
    return export_encoders(
        model.text_encoder,
        model.image_encoder,
        export_dir,
        version,
        metadata,
        verify=verify,
        **scoring_parameters(model),
    )


def export_encoders(
    text_encoder,
    image_encoder,
    export_dir: str,
    version: int | None = None,
    metadata: dict | None = None,
    *,
    logit_scale: float | None = None,
    logit_bias: float | None = None,
    verify: bool = True,
) -> ExportPaths:
    """Writes both towers as version ``version`` (default: next free) of ``export_dir``; returns their paths.

    ``text_encoder`` / ``image_encoder`` map a string batch [B] (captions / encoded image bytes) to [B, d]
    embeddings (``TwoTowerModel.text_encoder`` / ``.image_encoder``). ``metadata`` (JSON-able) is stored with
    the export, e.g. the resolved experiment config. ``logit_scale`` λ and ``logit_bias`` b (None: none) are the
    model's, so the manifest states its logit ``λ·s + b``. With ``verify`` each SavedModel is reloaded before it is
    published and must reproduce the Keras tower on the probe inputs to 1e-5.
    """
    import tensorflow as tf

    export_dir = os.path.abspath(export_dir)
    version = layout.next_version(export_dir) if version is None else int(version)
    if version <= 0:
        raise ValueError(f"version must be a positive integer, got {version}")
    finals = {
        part: layout.version_dir(export_dir, part, version) for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER)
    }
    for path in finals.values():
        if os.path.exists(path):
            raise FileExistsError(f"{path} already exists; versions are immutable, pick another --version")
    for path in layout.half_published(export_dir):  # a crashed earlier publish; its number stays unused
        atomic.remove_tree(path)

    probes_img = probe_images()
    text_probe = embed_with_keras(text_encoder, PROBE_TEXTS)
    image_probe = embed_with_keras(image_encoder, probes_img)
    if text_probe.ndim != 2 or image_probe.ndim != 2 or text_probe.shape[1] != image_probe.shape[1]:
        raise ValueError(
            "towers must return [B, d] embeddings of one size d; "
            f"got text {text_probe.shape}, image {image_probe.shape}"
        )
    text_fp, image_fp = weights_fingerprint(text_encoder), weights_fingerprint(image_encoder)
    meta = {
        "format": "ce_retrieval.export/1",
        "export_id": uuid.uuid4().hex,
        "version": version,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ce_retrieval_version": ce_retrieval.__version__,
        "tensorflow_version": tf.__version__,
        "embedding_dim": int(text_probe.shape[1]),
        "normalization": "l2",
        "score": "cosine (dot product of the L2-normalised embeddings); logit = logit_scale * score + logit_bias",
        "logit_scale": None if logit_scale is None else float(logit_scale),
        "logit_bias": None if logit_bias is None else float(logit_bias),
        "fingerprint": hashlib.sha256(f"{text_fp}:{image_fp}".encode()).hexdigest(),
        "text_fingerprint": text_fp,
        "image_fingerprint": image_fp,
        "signatures": {
            layout.TEXT_ENCODER: {"names": list(TEXT_SIGNATURES), "input": TEXT_INPUT, "output": OUTPUT},
            layout.IMAGE_ENCODER: {"names": list(IMAGE_SIGNATURES), "input": IMAGE_INPUT, "output": OUTPUT},
        },
        "probe": {
            "texts": list(PROBE_TEXTS),
            "text_embeddings": text_probe.tolist(),
            "image_embeddings": image_probe.tolist(),
        },
        "metadata": metadata or {},
    }

    temps: dict[str, str] = {}
    published: list[str] = []
    try:
        ops: set[str] = set()
        for part, encoder, input_name, names in (
            (layout.TEXT_ENCODER, text_encoder, TEXT_INPUT, TEXT_SIGNATURES),
            (layout.IMAGE_ENCODER, image_encoder, IMAGE_INPUT, IMAGE_SIGNATURES),
        ):
            temps[part] = atomic.temp_dir_for(finals[part])
            module = _servable(encoder, input_name)
            with _without_keras_traces():
                tf.saved_model.save(module, temps[part], signatures={name: module.embed for name in names})
            ops.update(custom_ops(temps[part]))
        meta["custom_ops"] = sorted(ops)
        for part in temps:
            layout.write_json(os.path.join(temps[part], layout.EXPORT_METADATA), dict(meta, part=part))
        if verify:
            _check_probes(temps[layout.TEXT_ENCODER], TEXT_INPUT, PROBE_TEXTS, text_probe)
            _check_probes(temps[layout.IMAGE_ENCODER], IMAGE_INPUT, probes_img, image_probe)
        for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
            atomic.publish_directory(temps[part], finals[part])
            published.append(finals[part])
    except BaseException:
        for path in published:  # roll back a half-published version (the text tower without its image tower)
            atomic.remove_tree(path)
        raise
    finally:
        for path in temps.values():
            atomic.remove_tree(path)
    return ExportPaths(version, finals[layout.TEXT_ENCODER], finals[layout.IMAGE_ENCODER], meta)
