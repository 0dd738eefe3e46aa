"""The digit-scene family: real handwritten digits (scikit-learn's bundled ``load_digits``) composed in pairs.

Why: the shapes are coarse and the project tuned on them. Real, fine-grained objects — digits that differ in a
few strokes, written by different people — test whether an objective's promise holds on data it never saw.
Nothing is downloaded: ``sklearn.datasets.load_digits`` reads 1,797 8x8 grey images (16 levels) shipped
inside the package.

A scene is two digits side by side on a dark canvas (``image_size`` square): each digit image is upsampled
(bilinear) to about 0.4 of the side, tinted with a jittered ink colour, placed with jitter in its half, plus
pixel noise. Digit instances are split by index (train 60 %, val 20 %, test 20 % of the 1,797), so a test
scene never reuses a training stroke. Captions (five templates, words or numerals):

    "two digits: three and five"           claims the set {3, 5}   (fits both orders)
    "the digits 3 and 5"                   claims the set {3, 5}
    "a three to the left of a five"        claims the order (3, 5)
    "a five to the right of a three"       claims the order (3, 5)
    "two digits, one of them a three"      claims 3 is present     (vague: fits ~1/5 of the scenes)
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from benchmarks.quality.families.family_format import FamilySplit
from ce_retrieval.data.synthetic import SPLIT_ID_OFFSET, SPLIT_INDEX

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_INKS = ((235, 235, 235), (250, 220, 80), (120, 210, 250), (250, 150, 150))
_POOL_FRACTIONS = {"train": (0.0, 0.6), "val": (0.6, 0.8), "test": (0.8, 1.0)}
_STREAM = 21


def _digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images.astype(np.float32) / 16.0, bunch.target.astype(np.int64)


def _name(rng: np.random.Generator, digit: int) -> str:
    return WORDS[digit] if rng.random() < 0.7 else str(digit)


def _article(word: str) -> str:
    return "an" if word in ("eight", "8") else "a"


def digit_caption(rng: np.random.Generator, left: int, right: int) -> tuple[str, frozenset]:
    """One caption of the scene (``left``, ``right``) and the facts it claims."""
    a, b = _name(rng, left), _name(rng, right)
    pair = "/".join(map(str, sorted((left, right))))
    t = int(rng.integers(5))
    if t == 0:
        x, y = (a, b) if rng.random() < 0.5 else (b, a)
        return f"two digits: {x} and {y}", frozenset({f"set:{pair}"})
    if t == 1:
        x, y = (a, b) if rng.random() < 0.5 else (b, a)
        return f"the digits {x} and {y}", frozenset({f"set:{pair}"})
    if t == 2:
        return f"{_article(a)} {a} to the left of {_article(b)} {b}", frozenset({f"order:{left}/{right}"})
    if t == 3:
        return f"{_article(b)} {b} to the right of {_article(a)} {a}", frozenset({f"order:{left}/{right}"})
    digit, word = (left, a) if rng.random() < 0.5 else (right, b)
    return f"two digits, one of them {_article(word)} {word}", frozenset({f"has:{digit}"})


def _render(rng: np.random.Generator, glyphs: list[np.ndarray], size: int) -> bytes:
    canvas = np.full((size, size, 3), 18.0, np.float32) + rng.uniform(-8, 8, size=3).astype(np.float32)
    side = int(round(0.4 * size))
    for half, glyph in enumerate(glyphs):
        ink = np.clip(np.asarray(_INKS[int(rng.integers(len(_INKS)))], np.float32) + rng.uniform(-20, 20, 3), 0, 255)
        scaled = side + int(rng.integers(-3, 4))
        alpha = (
            np.asarray(
                Image.fromarray((glyph * 255).astype(np.uint8)).resize((scaled, scaled), Image.BILINEAR), np.float32
            )[..., None]
            / 255.0
        )
        x0 = half * size // 2 + int(rng.integers(0, max(1, size // 2 - scaled)))
        y0 = int(rng.integers(0, max(1, size - scaled)))
        region = canvas[y0 : y0 + scaled, x0 : x0 + scaled]
        canvas[y0 : y0 + scaled, x0 : x0 + scaled] = region * (1 - alpha) + ink * alpha
    canvas += 6.0 * rng.standard_normal(canvas.shape).astype(np.float32)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(canvas.round(), 0, 255).astype(np.uint8), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def digit_attributes(left: int, right: int) -> np.ndarray:
    """Multi-hot (30): the left digit, the right digit, the digits present."""
    out = np.zeros(30, np.float32)
    out[left], out[10 + right], out[20 + left], out[20 + right] = 1, 1, 1, 1
    return out


def generate_digit_split(
    split: str, num_images: int, *, captions_per_image: int = 5, image_size: int = 64, seed: int = 0
) -> FamilySplit:
    """One split of the family, deterministic in (split, seed); two different digits per scene."""
    images_all, labels_all = _digits()
    lo, hi = (int(round(f * len(labels_all))) for f in _POOL_FRACTIONS[split])
    pool_images, pool_labels = images_all[lo:hi], labels_all[lo:hi]
    by_digit = [np.flatnonzero(pool_labels == d) for d in range(10)]
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM + SPLIT_INDEX[split]]))
    images, captions, claims, facts, attributes = [], [], [], [], []
    for _ in range(num_images):
        left, right = (int(d) for d in rng.choice(10, size=2, replace=False))
        glyphs = [pool_images[rng.choice(by_digit[d])] for d in (left, right)]
        caps, cl = [], []
        for _c in range(captions_per_image):
            for _retry in range(6):
                caption, claim = digit_caption(rng, left, right)
                if caption not in caps:
                    break
            caps.append(caption)
            cl.append(claim)
        images.append(_render(rng, glyphs, image_size))
        captions.append(caps)
        claims.append(cl)
        pair = "/".join(map(str, sorted((left, right))))
        facts.append(frozenset({f"set:{pair}", f"order:{left}/{right}", f"has:{left}", f"has:{right}"}))
        attributes.append(digit_attributes(left, right))
    image_ids = SPLIT_ID_OFFSET[split] + np.arange(num_images, dtype=np.int64)
    return FamilySplit(images, image_ids, captions, claims, facts, np.stack(attributes))


def digit_distractors(n: int, seed: int = 0, image_size: int = 64) -> list[bytes]:
    """``n`` crops of scikit-learn's bundled photographs (china.jpg, flower.jpg): relevant to no caption."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM + 3]))
    out = []
    for _ in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        side = int(rng.integers(48, 200))
        y, x = int(rng.integers(photo.shape[0] - side)), int(rng.integers(photo.shape[1] - side))
        crop = Image.fromarray(photo[y : y + side, x : x + side]).resize((image_size, image_size), Image.BILINEAR)
        buffer = io.BytesIO()
        crop.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out
