"""Image decoding and augmentation for the input pipeline (PIL and NumPy, no TensorFlow).

Every random choice is drawn from a `np.random.Generator` the caller seeds from the
example's position in the stream, so an augmented image is a pure function of
`(seed, position)`: a resumed run, or another number of processes, sees the same pixels.
"""

import io
import math

import numpy as np
from PIL import Image

from contrastive_jax.data_sources import Augment

# Random resized crop: aspect ratios tried and attempts before the whole image is taken
# (Inception-style, as `tf.image.sample_distorted_bounding_box` draws them).
_ASPECT_RANGE = (3 / 4, 4 / 3)
_CROP_ATTEMPTS = 10


def decode(encoded: bytes, channels: int, size: int | None = None) -> Image.Image:
    """An encoded image file as a PIL image of `channels` (1: "L", 3: "RGB").

    Grey, palette, CMYK and alpha images are converted (alpha is dropped). A JPEG larger
    than twice `size` is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain (libjpeg's
    scaling, PIL's `draft`), never below `size`.

    Raises:
      ValueError: the bytes are not an image PIL can decode.
    """
    try:
        image = Image.open(io.BytesIO(encoded))
        if size is not None and image.format == "JPEG":
            image.draft("L" if channels == 1 else "RGB", (size, size))
        image = image.convert("L" if channels == 1 else "RGB")
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise ValueError(f"cannot decode the image ({type(e).__name__}: {e})") from None
    return image


def to_array(image: Image.Image) -> np.ndarray:
    """uint8 [H, W, C] of a PIL image."""
    array = np.asarray(image, np.uint8)
    return array[..., None] if array.ndim == 2 else array


def resized(image: Image.Image, size: int | None) -> Image.Image:
    """The whole image at `size` x `size` (antialiased); unchanged when `size` is None."""
    if size is None or image.size == (size, size):
        return image
    return image.resize((size, size), Image.Resampling.BILINEAR)


def _crop_box(width: int, height: int, min_area: float, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random crop of `min_area`-1 of the image's area
    and an aspect ratio in `_ASPECT_RANGE`; the whole image when no draw fits."""
    log_ratio = np.log(_ASPECT_RANGE)
    for _ in range(_CROP_ATTEMPTS):
        area = width * height * rng.uniform(min_area, 1.0)
        ratio = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    return 0, 0, width, height


def augmented(image: Image.Image, size: int | None, aug: Augment, rng: np.random.Generator) -> np.ndarray:
    """float32 [size, size, C] in [0, 1] (native size when `size` is None): a random
    resized crop, flip, brightness / contrast jitter and Gaussian noise, each on when
    `aug` says so, drawn from `rng`."""
    width, height = image.size
    out_size = (size, size) if size is not None else (width, height)
    if aug.crop_min_area < 1.0:
        box = _crop_box(width, height, aug.crop_min_area, rng)
        image = image.resize(out_size, Image.Resampling.BILINEAR, box=box)
    elif image.size != out_size:
        image = image.resize(out_size, Image.Resampling.BILINEAR)
    pixels = to_array(image).astype(np.float32) / 255.0
    if aug.flip and rng.uniform() < 0.5:
        pixels = pixels[:, ::-1]
    if aug.color_jitter > 0:
        strength = 0.8 * aug.color_jitter
        pixels = pixels + rng.uniform(-strength, strength)
        mean = pixels.mean(axis=(0, 1), keepdims=True)
        pixels = (pixels - mean) * rng.uniform(1 - strength, 1 + strength) + mean
    if aug.noise_std > 0:
        pixels = pixels + aug.noise_std * rng.standard_normal(pixels.shape, np.float32)
    return np.clip(pixels, 0.0, 1.0, dtype=np.float32)
