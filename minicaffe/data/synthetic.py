"""Synthetic data of any shape, seeded: for benchmarks and tests that must not need a download.

Each class has a random uint8 template; an image is its class's template blended half and half
with uniform noise.  So the data are learnable (a net can reach high accuracy on them, which a
convergence smoke test can check) and yet cost nothing to make.  Same arguments -> same arrays.
"""

import numpy as np

from ._util import DatasetError


def make(shape, num_classes=10, count=1024, seed=0):
    """``count`` images of ``shape`` (C, H, W) uint8 and labels in [0, num_classes)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise DatasetError(f"synthetic data: shape must be 3 positive sizes (C, H, W), got {shape}")
    if num_classes < 1 or count < 1:
        raise DatasetError(f"synthetic data: need at least 1 class and 1 image, got {num_classes} and {count}")
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(num_classes,) + shape, dtype=np.uint8)
    labels = rng.integers(0, num_classes, size=count).astype(np.int64)
    noise = rng.integers(0, 256, size=(count,) + shape, dtype=np.uint8)
    images = ((templates[labels].astype(np.uint16) + noise) // 2).astype(np.uint8)
    return images, labels


def parse_spec(spec):
    """``"synthetic:CxHxW[:classes[:count[:seed]]]"`` -> keyword arguments of :func:`make`."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    fields = body.split(":") if body else []
    usage = (
        'write it as "synthetic:CxHxW[:classes[:count[:seed]]]", e.g. "synthetic:3x32x32:10" or '
        '"synthetic:1x28x28:10:60000:1"'
    )
    if not fields or not 1 <= len(fields) <= 4:
        raise DatasetError(f"bad synthetic source '{spec}': {usage}")
    try:
        shape = tuple(int(d) for d in fields[0].lower().split("x"))
        rest = [int(f) for f in fields[1:]]
    except ValueError:
        raise DatasetError(f"bad synthetic source '{spec}': {usage}") from None
    if len(shape) != 3:
        raise DatasetError(f"bad synthetic source '{spec}': the shape needs 3 sizes C x H x W; {usage}")
    kwargs = {"shape": shape}
    for key, value in zip(("num_classes", "count", "seed"), rest):
        kwargs[key] = value
    return kwargs
