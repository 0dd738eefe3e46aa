"""The vague-caption family: synthetic scenes whose captions often name only one or two attributes.

Why: on real sets many captions fit several images ("a dog on the grass"), so the in-batch negatives of a
contrastive loss include images the caption describes just as well, and a test "miss" may be a correct answer.
Here that is controlled: each caption is, with probability ``vague_fraction``, one of the templates below,
which claims only a subset of the scene (its fits are every image holding those facts), else the full
synthetic caption (``synthetic.captions_for``: one scene, fitting its near-duplicates only).

    "something {colour}"                     claims colour          (fits ~1/4 of the images)
    "some {shapes}" / "a picture with ..."   claims shape
    "{colour} {shapes}"                      claims a colour x shape pair
    "shapes on a {background} background"    claims background
    "{colour} things on a {bg} background"   claims colour and background
    "{colour} {shapes} and something {c2}"   claims a pair and a second colour (two-group scenes)

Words are drawn from the synthetic set's synonyms. Scenes, drawing and ids are those of
:mod:`ce_retrieval.data.synthetic` (one seed stream per split, disjoint from the shapes family's).
"""

from __future__ import annotations

import numpy as np

from benchmarks.quality.families.family_format import FamilySplit
from benchmarks.quality.families.scene_facts import full_caption_claim, scene_attributes, scene_facts
from ce_retrieval.data import synthetic as syn

_STREAM = 11  # seed stream offset: not the shapes family's scenes


def _plural(rng, shape: str) -> str:
    return syn._pick(rng, syn.SHAPES[shape])[1]


def _color(rng, color: str) -> str:
    return syn._pick(rng, syn.COLORS[color][1])


def vague_caption(rng: np.random.Generator, scene: syn.Scene) -> tuple[str, frozenset]:
    """One vague caption of ``scene`` and the facts it claims."""
    g = scene.groups[int(rng.integers(len(scene.groups)))]
    templates = 6 if len(scene.groups) == 2 else 5
    t = int(rng.integers(templates))
    if t == 0:
        return f"something {_color(rng, g.color)}", frozenset({f"color:{g.color}"})
    if t == 1:
        lead = syn._pick(rng, ("some", "a picture with", "an image with"))
        return f"{lead} {_plural(rng, g.shape)}", frozenset({f"shape:{g.shape}"})
    if t == 2:
        return f"{_color(rng, g.color)} {_plural(rng, g.shape)}", frozenset({f"pair:{g.color}/{g.shape}"})
    if t == 3:
        bg = syn._pick(rng, syn.BACKGROUNDS[scene.background][2])
        return f"shapes on a {bg} background", frozenset({f"bg:{scene.background}"})
    if t == 4:
        bg = syn._pick(rng, syn.BACKGROUNDS[scene.background][2])
        return (
            f"{_color(rng, g.color)} things on a {bg} background",
            frozenset({f"color:{g.color}", f"bg:{scene.background}"}),
        )
    other = scene.groups[1] if g is scene.groups[0] else scene.groups[0]
    return (
        f"{_color(rng, g.color)} {_plural(rng, g.shape)} and something {_color(rng, other.color)}",
        frozenset({f"pair:{g.color}/{g.shape}", f"color:{other.color}"}),
    )


def generate_vague_split(
    split: str,
    num_images: int,
    *,
    captions_per_image: int = 5,
    image_size: int = 64,
    seed: int = 0,
    vague_fraction: float = 0.6,
) -> FamilySplit:
    """One split of the family, deterministic in (split, seed); ids as in the synthetic set."""
    if not 0.0 <= vague_fraction <= 1.0:
        raise ValueError(f"vague_fraction must be in [0, 1], got {vague_fraction}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM + syn.SPLIT_INDEX[split]]))
    images, captions, claims, facts, attributes = [], [], [], [], []
    for _ in range(num_images):
        scene = syn.sample_scene(rng)
        png, _ = syn.render(rng, scene, image_size)
        caps, cl = [], []
        for _c in range(captions_per_image):
            for _retry in range(6):  # distinct captions where a few retries allow
                if rng.random() < vague_fraction:
                    caption, claim = vague_caption(rng, scene)
                else:
                    caption = syn.captions_for(rng, scene, 1)[0]
                    claim = full_caption_claim(scene, caption)
                if caption not in caps:
                    break
            caps.append(caption)
            cl.append(claim)
        images.append(png)
        captions.append(caps)
        claims.append(cl)
        facts.append(scene_facts(scene))
        attributes.append(scene_attributes(scene))
    image_ids = syn.SPLIT_ID_OFFSET[split] + np.arange(num_images, dtype=np.int64)
    return FamilySplit(images, image_ids, captions, claims, facts, np.stack(attributes))
