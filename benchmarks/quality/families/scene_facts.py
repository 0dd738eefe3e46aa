"""What a synthetic scene shows, as the two views the dataset families need: attributes and facts.

* :func:`scene_attributes` — a multi-hot attribute vector (95 entries: background, relation, each group's
  colour / shape / size / count, and the colour x shape pairs present). It is the pretraining target of the
  frozen-feature benchmarks (``benchmarks/quality/pretrained_features.py``): generic, unaligned features.
* :func:`scene_facts` — the set of statements true of a scene (``"color:red"``, ``"pair:red/star"``,
  ``"scene:<key>"`` ...). A caption *claims* a set of facts, and it fits every image whose facts contain its
  claim (``claim ⊆ facts``); :mod:`benchmarks.quality.families.family_format` turns this into the images each caption
  fits, the ground truth the id-based labels cannot express.
"""

from __future__ import annotations

import numpy as np

from ce_retrieval.data import synthetic as syn

SIZE_WORDS = frozenset(w for words in syn.SIZES.values() for w in words)


def scene_attributes(scene: syn.Scene) -> np.ndarray:
    """Multi-hot attribute vector of a synthetic :class:`~ce_retrieval.data.synthetic.Scene` (95 entries)."""
    colors, shapes = list(syn.COLORS), list(syn.SHAPES)
    sizes, counts = list(syn.SIZES), list(syn.COUNTS)
    backgrounds, relations = list(syn.BACKGROUNDS), list(syn.RELATIONS)
    group_width = len(colors) + len(shapes) + len(sizes) + len(counts)
    out = np.zeros(len(backgrounds) + len(relations) + 1 + 2 * group_width + len(colors) * len(shapes), np.float32)
    out[backgrounds.index(scene.background)] = 1
    base = len(backgrounds)
    out[base + (relations.index(scene.relation) if scene.relation else len(relations))] = 1
    base += len(relations) + 1
    for g, group in enumerate(scene.groups):
        o = base + g * group_width
        out[o + colors.index(group.color)] = 1
        out[o + len(colors) + shapes.index(group.shape)] = 1
        out[o + len(colors) + len(shapes) + sizes.index(group.size)] = 1
        out[o + len(colors) + len(shapes) + len(sizes) + counts.index(group.count)] = 1
    pairs = base + 2 * group_width
    for group in scene.groups:
        out[pairs + colors.index(group.color) * len(shapes) + shapes.index(group.shape)] = 1
    return out


def _scene_key(scene: syn.Scene, with_size: bool) -> str:
    """A canonical text key of the whole scene ("A above B" and "B below A" give one key)."""
    groups = [f"{g.count}{'/' + g.size if with_size else ''}/{g.color}/{g.shape}" for g in scene.groups]
    relation = scene.relation
    if relation in ("below", "right"):
        groups, relation = groups[::-1], syn.INVERSE_RELATION[relation]
    return f"{scene.background}|{relation}|{'+'.join(groups)}"


def scene_facts(scene: syn.Scene) -> frozenset[str]:
    """Every statement a caption of the synthetic families may claim about ``scene``."""
    facts = {f"bg:{scene.background}", f"groups:{len(scene.groups)}"}
    for g in scene.groups:
        facts |= {f"color:{g.color}", f"shape:{g.shape}", f"pair:{g.color}/{g.shape}"}
    facts |= {f"scene:{_scene_key(scene, False)}", f"scene+size:{_scene_key(scene, True)}"}
    return frozenset(facts)


def full_caption_claim(scene: syn.Scene, caption: str) -> frozenset[str]:
    """The claim of a full synthetic caption (``synthetic._caption``): the whole scene, with the sizes only if
    the caption names one (captions that omit sizes fit the same scene at any size)."""
    with_size = bool(SIZE_WORDS & set(caption.replace(",", " ").split()))
    return frozenset({f"scene+size:{_scene_key(scene, True)}" if with_size else f"scene:{_scene_key(scene, False)}"})
