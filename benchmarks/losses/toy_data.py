"""Labelled toy data, the one generator of the toy harnesses (``toy_losses.py``, ``dml_comparison.py``) and their tests.

C classes with means in ``signal_dim`` dimensions (``class_spread`` x N(0, I)). A sample of class c is its mean
plus ``noise`` x N(0, I) in those dimensions, followed by ``nuisance_dim`` dimensions of class-independent noise
of scale ``nuisance_scale``. Raw (or randomly projected) inputs therefore retrieve poorly, and an embedding that
learns to ignore the nuisance retrieves well.

* :class:`GaussianClasses` draws the means once and then samples any labels on demand (fresh views of a class
  for every batch: ``toy_losses.py`` trains on two independent samples per label).
* :func:`make_labelled_data` is one fixed data set ``(x, y)`` of ``per_class`` samples per class whose
  coordinates are mixed by a random rotation, so the nuisance is not axis-aligned (``dml_comparison.py``: train on
  some classes, evaluate on the others).

Both are pure functions of their seed. The generator lives here rather than in the library: nothing in
``ce_retrieval`` consumes flat labelled vectors, and its parameters are tuned to the harnesses' tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["GaussianClasses", "make_labelled_data"]


@dataclasses.dataclass(frozen=True)
class GaussianClasses:
    """Class means (``means``: [C, signal_dim]) and the noise model of the module docstring."""

    means: np.ndarray
    noise: float = 0.6
    nuisance_dim: int = 24
    nuisance_scale: float = 2.0

    @classmethod
    def draw(
        cls,
        num_classes: int,
        signal_dim: int = 8,
        nuisance_dim: int = 24,
        *,
        class_spread: float = 1.0,
        noise: float = 0.6,
        nuisance_scale: float = 2.0,
        seed: int | np.random.Generator = 0,
        dtype=np.float64,
    ) -> GaussianClasses:
        """Draws the class means from ``seed`` (an int or a Generator, which is advanced) and keeps them as
        ``dtype``."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        means = (class_spread * rng.standard_normal((num_classes, signal_dim))).astype(dtype)
        return cls(means, noise=noise, nuisance_dim=nuisance_dim, nuisance_scale=nuisance_scale)

    @property
    def num_classes(self) -> int:
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        """Input dimension: signal plus nuisance coordinates."""
        return self.means.shape[1] + self.nuisance_dim

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        """One float64 sample ``[len(labels), dim]`` per label: signal noise is drawn first, then the nuisance."""
        labels = np.asarray(labels)
        signal = self.means[labels] + self.noise * rng.standard_normal((len(labels), self.means.shape[1]))
        nuisance = self.nuisance_scale * rng.standard_normal((len(labels), self.nuisance_dim))
        return np.concatenate([signal, nuisance], axis=1)


def make_labelled_data(
    num_classes: int = 40,
    per_class: int = 30,
    signal_dim: int = 8,
    nuisance_dim: int = 24,
    class_spread: float = 1.0,
    noise: float = 0.6,
    nuisance_scale: float = 2.5,
    seed: int = 0,
):
    """``(x [C·n, signal_dim + nuisance_dim] float32, y [C·n] int32)``, ``per_class`` samples of each class in
    class order, randomly rotated; see the module docstring."""
    rng = np.random.default_rng(seed)
    classes = GaussianClasses.draw(
        num_classes,
        signal_dim,
        nuisance_dim,
        class_spread=class_spread,
        noise=noise,
        nuisance_scale=nuisance_scale,
        seed=rng,
    )
    y = np.repeat(np.arange(num_classes), per_class)
    x = classes.sample(y, rng)
    rotation, _ = np.linalg.qr(rng.standard_normal((classes.dim,) * 2))
    return (x @ rotation).astype(np.float32), y.astype(np.int32)
