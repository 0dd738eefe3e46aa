"""The embedded synthetic image-caption dataset: procedurally drawn scenes with templated captions.

Why: the project's main job must train and evaluate a two-tower model end to end without downloading anything,
on a CPU, in minutes, and the set must still be hard enough that losses differ and that a global relevance
threshold (calibration) matters. So no single word identifies an image:

* a scene holds one or two *groups* of objects; a group is (count 1-3, size, colour, shape), and two groups
  stand in a spatial relation (above / below / left of / right of), on one of four backgrounds;
* 8 colours x 6 shapes x 2 sizes x 3 counts give 288 groups, so many images share most attributes;
* captions use synonyms ("crimson discs"), several templates and word orders ("A above B" = "B beneath A"),
  and sometimes omit the size or the background, so one caption can fit several images;
* a share of images (``near_duplicate_fraction``) re-render an earlier image's scene with new positions and
  shading: their captions are genuinely ambiguous between the two images.

Images are drawn with PIL on a 4x supersampled mask (anti-aliased edges), shaded with per-image colour jitter
and pixel noise, and PNG-encoded (default 64x64). Everything is deterministic in ``seed``: the same seed gives
identical bytes. Splits draw from independent seed streams (``SeedSequence([seed, split_index])``); image ids
are ``split_offset + index`` so ids never collide across splits. :func:`distractor_images` draws scenes from a
disjoint shape set (hexagons, rings, pentagons, bow ties) that no caption describes.
"""

from __future__ import annotations

import dataclasses
import functools
import io

import numpy as np
from PIL import Image, ImageDraw

SPLIT_INDEX = {"train": 0, "val": 1, "test": 2}
SPLIT_ID_OFFSET = {"train": 0, "val": 1_000_000_000, "test": 2_000_000_000}
_DISTRACTOR_STREAM = 3
_SUPERSAMPLE = 4
_OBJECT_NOISE = 4.0

# Canonical attribute -> (RGB, synonyms). The first synonym is the canonical word.
COLORS: dict[str, tuple[tuple[int, int, int], tuple[str, ...]]] = {
    "red": ((215, 35, 35), ("red", "crimson", "scarlet")),
    "green": ((40, 170, 55), ("green", "emerald", "lime")),
    "blue": ((40, 75, 215), ("blue", "azure", "cobalt")),
    "yellow": ((235, 215, 35), ("yellow", "golden", "lemon")),
    "purple": ((135, 45, 185), ("purple", "violet", "plum")),
    "orange": ((245, 135, 20), ("orange", "amber", "tangerine")),
    "cyan": ((35, 200, 210), ("cyan", "teal", "turquoise")),
    "pink": ((245, 125, 185), ("pink", "rose", "salmon")),
}
# Shape -> (singular, plural) noun pairs.
SHAPES: dict[str, tuple[tuple[str, str], ...]] = {
    "circle": (("circle", "circles"), ("disc", "discs"), ("dot", "dots")),
    "square": (("square", "squares"), ("block", "blocks")),
    "triangle": (("triangle", "triangles"),),
    "star": (("star", "stars"),),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombuses")),
    "cross": (("cross", "crosses"), ("plus sign", "plus signs")),
}
DISTRACTOR_SHAPES = ("hexagon", "ring", "pentagon", "bowtie")
SIZES: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big", "huge")}
COUNTS: dict[int, tuple[str, ...]] = {1: ("a", "one", "a single"), 2: ("two", "a pair of"), 3: ("three", "a trio of")}
RELATIONS: dict[str, tuple[str, ...]] = {
    "above": ("above", "over", "on top of"),
    "below": ("below", "beneath", "under"),
    "left": ("to the left of", "left of"),
    "right": ("to the right of", "right of"),
}
INVERSE_RELATION = {"above": "below", "below": "above", "left": "right", "right": "left"}
# Background -> (base RGB, pixel-noise sigma, synonyms).
BACKGROUNDS: dict[str, tuple[tuple[int, int, int], float, tuple[str, ...]]] = {
    "dark": ((22, 22, 28), 5.0, ("dark", "black")),
    "gray": ((125, 125, 125), 5.0, ("gray", "grey")),
    "light": ((228, 228, 222), 5.0, ("light", "white", "pale")),
    "speckled": ((95, 95, 100), 26.0, ("speckled", "noisy", "grainy")),
}
# Radius as a fraction of the image side, per size (clipped to the object's layout cell).
_RADIUS = {"small": (0.055, 0.08), "large": (0.13, 0.17)}


@dataclasses.dataclass(frozen=True)
class Group:
    count: int
    size: str
    color: str
    shape: str


@dataclasses.dataclass(frozen=True)
class Scene:
    """What an image shows: groups[0] stands in ``relation`` to groups[1] (relation None for one group)."""

    groups: tuple[Group, ...]
    relation: str | None
    background: str


@dataclasses.dataclass(frozen=True)
class DrawnObject:
    group: int  # index into Scene.groups
    center: tuple[float, float]  # (x, y) in pixels
    radius: float
    rgb: tuple[int, int, int]  # the shaded colour actually drawn


@dataclasses.dataclass
class SyntheticSplit:
    """One generated split: image i has id ``image_ids[i]``, PNG bytes ``images[i]``, ``captions[i]``."""

    name: str
    images: list[bytes]
    image_ids: np.ndarray
    captions: list[list[str]]
    scenes: list[Scene]
    objects: list[list[DrawnObject]]
    duplicate_of: np.ndarray  # index of the image whose scene was re-rendered, or -1

    def flat_captions(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(captions, their image ids, their image indices), one entry per caption, image-major."""
        captions = [c for caps in self.captions for c in caps]
        index = np.repeat(np.arange(len(self.captions)), [len(c) for c in self.captions]).astype(np.int64)
        return captions, self.image_ids[index], index


# ----------------------------------------------------------------------------------------------------------
# Scenes and captions.


def _sample_group(rng: np.random.Generator, shapes: tuple[str, ...]) -> Group:
    return Group(
        count=int(rng.integers(1, 4)),
        size=str(rng.choice(list(SIZES))),
        color=str(rng.choice(list(COLORS))),
        shape=str(rng.choice(shapes)),
    )


def sample_scene(rng: np.random.Generator, shapes: tuple[str, ...] = tuple(SHAPES)) -> Scene:
    """One or (with probability 3/4) two groups differing in colour or shape, plus relation and background."""
    background = str(rng.choice(list(BACKGROUNDS)))
    first = _sample_group(rng, shapes)
    if rng.random() < 0.25:
        return Scene(groups=(first,), relation=None, background=background)
    while True:
        second = _sample_group(rng, shapes)
        if (second.color, second.shape) != (first.color, first.shape):
            break
    return Scene(groups=(first, second), relation=str(rng.choice(list(RELATIONS))), background=background)


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _noun(rng: np.random.Generator, group: Group) -> str:
    singular, plural = _pick(rng, SHAPES[group.shape])
    return singular if group.count == 1 else plural


def _noun_phrase(rng: np.random.Generator, group: Group, with_size: bool) -> str:
    """E.g. "two small red circles", "a pair of little crimson discs", "three stars, big and teal"."""
    count = _pick(rng, COUNTS[group.count])
    size = _pick(rng, SIZES[group.size]) if with_size else None
    color = _pick(rng, COLORS[group.color][1])
    noun = _noun(rng, group)
    if with_size and rng.random() < 0.2:
        words = [count, noun + ",", size, "and", color + ","]  # trailing comma tidied by _tidy
    else:
        words = [count] + ([size] if size else []) + [color, noun]
    if words[0] == "a" and words[1][0] in "aeiou":
        words[0] = "an"
    return " ".join(words)


def _tidy(caption: str) -> str:
    return caption.replace(",,", ",").rstrip(",")


def _caption(rng: np.random.Generator, scene: Scene) -> str:
    return _tidy(_framed_caption(rng, scene))


def _framed_caption(rng: np.random.Generator, scene: Scene) -> str:
    with_size = rng.random() >= 0.2  # sometimes omit sizes: the caption then fits more images
    background = _pick(rng, BACKGROUNDS[scene.background][2])
    first = _noun_phrase(rng, scene.groups[0], with_size)
    if len(scene.groups) == 1:
        body = first
    else:
        second = _noun_phrase(rng, scene.groups[1], with_size)
        template = int(rng.integers(3))
        if template == 0:
            body = f"{first} {_pick(rng, RELATIONS[scene.relation])} {second}"
        elif template == 1:
            body = f"{second} {_pick(rng, RELATIONS[INVERSE_RELATION[scene.relation]])} {first}"
        else:
            relation = _pick(rng, RELATIONS[scene.relation])
            a, b = _noun(rng, scene.groups[0]), _noun(rng, scene.groups[1])
            if scene.groups[0].shape == scene.groups[1].shape:  # "the lime stars above the violet stars"
                a = f"{_pick(rng, COLORS[scene.groups[0].color][1])} {a}"
                b = f"{_pick(rng, COLORS[scene.groups[1].color][1])} {b}"
            body = f"{first} and {second}, the {a} {relation} the {b}"
    frame = int(rng.integers(5))
    if frame == 0:
        return f"{body} on a {background} background"
    if frame == 1:
        return f"a {background} background with {body}"
    if frame == 2:
        return f"there {'is' if body.startswith(('a ', 'an ', 'one ')) else 'are'} {body}"
    if frame == 3:
        return f"{_pick(rng, ('a picture of', 'an image of', 'a drawing of'))} {body}"
    return body


def captions_for(rng: np.random.Generator, scene: Scene, n: int) -> list[str]:
    """``n`` captions of one scene; distinct where a few retries allow."""
    out: list[str] = []
    for _ in range(n):
        caption = _caption(rng, scene)
        for _retry in range(4):
            if caption not in out:
                break
            caption = _caption(rng, scene)
        out.append(caption)
    return out


# ----------------------------------------------------------------------------------------------------------
# Drawing.


def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if shape in ("square", "diamond"):
        k, offset, radii = 4, np.pi / 4 if shape == "square" else 0.0, [r]
        if shape == "diamond":
            radii = [r, 0.7 * r]  # taller than wide, so it is not a rotated square
    elif shape == "triangle":
        k, offset, radii = 3, -np.pi / 2, [r]
    elif shape == "star":
        k, offset, radii = 10, -np.pi / 2, [r, 0.45 * r]
    elif shape == "hexagon":
        k, offset, radii = 6, 0.0, [r]
    elif shape == "pentagon":
        k, offset, radii = 5, -np.pi / 2, [r]
    elif shape == "cross":
        w = 0.36 * r
        pts = [
            (-w, -r),
            (w, -r),
            (w, -w),
            (r, -w),
            (r, w),
            (w, w),
            (w, r),
            (-w, r),
            (-w, w),
            (-r, w),
            (-r, -w),
            (-w, -w),
        ]
        return _rotate(pts, cx, cy, angle)
    elif shape == "bowtie":
        pts = [(-r, -0.8 * r), (0.0, -0.1 * r), (r, -0.8 * r), (r, 0.8 * r), (0.0, 0.1 * r), (-r, 0.8 * r)]
        return _rotate(pts, cx, cy, angle)
    else:
        raise ValueError(f"no polygon for shape {shape!r}")
    theta = offset + np.arange(k) * 2 * np.pi / k
    if shape == "diamond":
        rad = np.where(np.arange(k) % 2 == 0, radii[1], radii[0])
        theta = np.arange(k) * 2 * np.pi / k
    else:
        rad = np.resize(np.asarray(radii, dtype=float), k)
    pts = list(zip((rad * np.cos(theta)).tolist(), (rad * np.sin(theta)).tolist(), strict=True))
    return _rotate(pts, cx, cy, angle)


def _rotate(pts, cx, cy, angle):
    c, s = np.cos(angle), np.sin(angle)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, angle: float) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=255, width=max(1, int(round(0.35 * r))))
    else:
        draw.polygon(_polygon(shape, cx, cy, r, angle), fill=255)


def _layout(rng: np.random.Generator, scene: Scene, size: int) -> list[tuple[int, float, float, float]]:
    """(group, cx, cy, r) per object. Two groups get the two halves of the canvas given by the relation."""
    half = size / 2.0
    if scene.relation is None:
        regions = [(0.0, 0.0, float(size), float(size))]
    elif scene.relation in ("above", "below"):
        top, bottom = (0.0, 0.0, float(size), half), (0.0, half, float(size), float(size))
        regions = [top, bottom] if scene.relation == "above" else [bottom, top]
    else:
        left, right = (0.0, 0.0, half, float(size)), (half, 0.0, float(size), float(size))
        regions = [left, right] if scene.relation == "left" else [right, left]
    placed = []
    for g, (group, (x0, y0, x1, y1)) in enumerate(zip(scene.groups, regions, strict=True)):
        w, h = x1 - x0, y1 - y0
        along_x = w > h or (w == h and rng.random() < 0.5)
        for k in range(group.count):
            if along_x:
                cell = (x0 + k * w / group.count, y0, x0 + (k + 1) * w / group.count, y1)
            else:
                cell = (x0, y0 + k * h / group.count, x1, y0 + (k + 1) * h / group.count)
            cw, ch = cell[2] - cell[0], cell[3] - cell[1]
            lo, hi = _RADIUS[group.size]
            r = min(size * rng.uniform(lo, hi), 0.46 * min(cw, ch))
            cx = (cell[0] + cell[2]) / 2 + rng.uniform(-1, 1) * max(0.0, cw / 2 - r - 1)
            cy = (cell[1] + cell[3]) / 2 + rng.uniform(-1, 1) * max(0.0, ch / 2 - r - 1)
            placed.append((g, cx, cy, r))
    return placed


def render(rng: np.random.Generator, scene: Scene, size: int) -> tuple[bytes, list[DrawnObject]]:
    """PNG bytes of ``scene`` at ``size`` x ``size`` and the objects drawn (for tests and inspection)."""
    base, sigma, _ = BACKGROUNDS[scene.background]
    background = np.asarray(base, np.float32) + rng.uniform(-12, 12, size=3).astype(np.float32)
    canvas = np.broadcast_to(background, (size, size, 3))
    coverage = np.zeros((size, size, 1), np.float32)
    objects: list[DrawnObject] = []
    layout = _layout(rng, scene, size)
    s = _SUPERSAMPLE
    for g, group in enumerate(scene.groups):
        rgb = np.clip(np.asarray(COLORS[group.color][0], np.float32) + rng.uniform(-18, 18, size=3), 0, 255)
        mask_img = Image.new("L", (size * s, size * s), 0)
        draw = ImageDraw.Draw(mask_img)
        for og, cx, cy, r in layout:
            if og != g:
                continue
            angle = float(rng.uniform(-0.3, 0.3))
            _draw_shape(draw, group.shape, cx * s, cy * s, r * s, angle)
            objects.append(DrawnObject(g, (cx, cy), r, tuple(int(v) for v in rgb.round())))
        alpha = np.asarray(mask_img.resize((size, size), Image.BOX), np.float32)[..., None] / 255.0
        canvas = canvas * (1.0 - alpha) + rgb * alpha
        coverage = np.maximum(coverage, alpha)
    # Pixel noise: the background's texture where no object is, mild shading noise on objects.
    noise_sigma = sigma * (1.0 - coverage) + _OBJECT_NOISE * coverage
    canvas = canvas + noise_sigma * rng.standard_normal((size, size, 3), dtype=np.float32)
    pixels = np.clip(canvas.round(), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue(), objects


# ----------------------------------------------------------------------------------------------------------
# Splits.


def generate_split(
    split: str,
    num_images: int,
    *,
    captions_per_image: int = 5,
    image_size: int = 64,
    seed: int = 0,
    near_duplicate_fraction: float = 0.1,
) -> SyntheticSplit:
    """Generate one split deterministically from (split, seed) and the sizes."""
    if split not in SPLIT_INDEX:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_INDEX)}")
    if num_images < 1 or num_images >= 1_000_000_000:
        raise ValueError(f"num_images must be in [1, 1e9), got {num_images}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLIT_INDEX[split]]))
    images, captions, scenes, objects = [], [], [], []
    duplicate_of = np.full(num_images, -1, np.int64)
    for i in range(num_images):
        if i > 0 and rng.random() < near_duplicate_fraction:
            duplicate_of[i] = int(rng.integers(i))
            scene = scenes[duplicate_of[i]]
        else:
            scene = sample_scene(rng)
        png, drawn = render(rng, scene, image_size)
        images.append(png)
        scenes.append(scene)
        objects.append(drawn)
        captions.append(captions_for(rng, scene, captions_per_image))
    image_ids = SPLIT_ID_OFFSET[split] + np.arange(num_images, dtype=np.int64)
    return SyntheticSplit(split, images, image_ids, captions, scenes, objects, duplicate_of)


@functools.lru_cache(maxsize=8)
def _cached_split(split, num_images, captions_per_image, image_size, seed, near_duplicate_fraction) -> SyntheticSplit:
    return generate_split(
        split,
        num_images,
        captions_per_image=captions_per_image,
        image_size=image_size,
        seed=seed,
        near_duplicate_fraction=near_duplicate_fraction,
    )


def split_from_config(cfg, split: str) -> SyntheticSplit:
    """The split described by a :class:`~ce_retrieval.data.config.DataConfig` (memoised in-process)."""
    num = {"train": cfg.num_train_images, "val": cfg.num_val_images, "test": cfg.num_test_images}
    if split not in num:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(num)}")
    return _cached_split(
        split, num[split], cfg.captions_per_image, cfg.image_size, cfg.seed, cfg.near_duplicate_fraction
    )


def distractor_images(n: int, seed: int = 0, image_size: int = 64) -> list[bytes]:
    """``n`` PNG images of scenes made only of shapes no caption names (relevant to no caption)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _DISTRACTOR_STREAM]))
    out = []
    for _ in range(n):
        png, _ = render(rng, sample_scene(rng, DISTRACTOR_SHAPES), image_size)
        out.append(png)
    return out
