"""Image decoding and augmentation for the input pipeline (PIL and NumPy, no TensorFlow).

Every random choice comes from draws the caller makes from the example's position in
the stream (`stateless_random`), so an augmented image is a pure function of
`(seed, position)`: a resumed run, or another number of processes, sees the same pixels.
"""

import io
import math

import numpy as np
from PIL import Image

from contrastive_jax.data.settings import Augment

# Random resized crop: aspect ratios tried and attempts before the whole image is taken
# (Inception-style, as `tf.image.sample_distorted_bounding_box` draws them).
_ASPECT_RANGE = (3 / 4, 4 / 3)
_CROP_ATTEMPTS = 10


def decode(encoded: bytes, channels: int, size: int | None = None) -> Image.Image:
    """An encoded image file as a PIL image of `channels` (1: "L", 3: "RGB").

    Grey, palette, CMYK and alpha images are converted (alpha is dropped). A JPEG larger
    than twice `size` is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain (libjpeg's
    scaling, PIL's `draft`), never below `size`. Binary PGM / PPM files (raw pixels:
    what small images are best stored as) are read without PIL's decoders.

    Raises:
      ValueError: the bytes are not an image PIL can decode.
    """
    try:
        image = _netpbm(encoded)
        if image is None:
            image = Image.open(io.BytesIO(encoded))
            if size is not None and image.format == "JPEG":
                image.draft("L" if channels == 1 else "RGB", (size, size))
        mode = "L" if channels == 1 else "RGB"
        return image if image.mode == mode else image.convert(mode)
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise ValueError(f"cannot decode the image ({type(e).__name__}: {e})") from None


def _netpbm(encoded: bytes) -> Image.Image | None:
    """A binary 8-bit PGM (P5) or PPM (P6) file's image; None for any other file."""
    if encoded[:2] not in (b"P5", b"P6"):
        return None
    magic, width, height, maximum, _ = encoded.split(maxsplit=4)
    width, height, channels = int(width), int(height), 1 if magic == b"P5" else 3
    if int(maximum) != 255:
        return None
    pixels = np.frombuffer(encoded[len(encoded) - width * height * channels :], np.uint8)
    return Image.fromarray(pixels.reshape((height, width) if channels == 1 else (height, width, 3)))


def to_array(image: Image.Image) -> np.ndarray:
    """uint8 [H, W, C] of a PIL image."""
    array = np.asarray(image, np.uint8)
    return array[..., None] if array.ndim == 2 else array


def resized(image: Image.Image, size: int | None) -> Image.Image:
    """The whole image at `size` x `size` (antialiased); unchanged when `size` is None."""
    if size is None or image.size == (size, size):
        return image
    return image.resize((size, size), Image.Resampling.BILINEAR)


# Uniform draws `augmented` reads: 4 per crop attempt (area, aspect, left, top), then
# the flip, the brightness and the contrast.
NUM_DRAWS = 4 * _CROP_ATTEMPTS + 3


def _crop_box(width: int, height: int, min_area: float, draws: np.ndarray) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random crop of `min_area`-1 of the image's area
    and an aspect ratio in `_ASPECT_RANGE`; the whole image when no draw fits."""
    log_low, log_high = np.log(_ASPECT_RANGE)
    for attempt in range(_CROP_ATTEMPTS):
        u_area, u_ratio, u_left, u_top = draws[4 * attempt : 4 * attempt + 4]
        area = width * height * (min_area + (1.0 - min_area) * u_area)
        ratio = math.exp(log_low + (log_high - log_low) * u_ratio)
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(u_left * (width - w + 1)), int(u_top * (height - h + 1))
            return left, top, left + w, top + h
    return 0, 0, width, height


def augmented(image: Image.Image, size: int | None, aug: Augment, draws: np.ndarray) -> np.ndarray:
    """uint8 [size, size, C] (native size when `size` is None): a random resized crop and
    flip, each on when `aug` says so. (Brightness / contrast jitter and pixel noise are
    applied to the whole batch at once: `photometric`.)

    Args:
      draws: float64 [NUM_DRAWS] uniform in [0, 1): every random choice.
    """
    width, height = image.size
    out_size = (size, size) if size is not None else (width, height)
    if aug.crop_min_area < 1.0:
        box = _crop_box(width, height, aug.crop_min_area, draws)
        image = image.resize(out_size, Image.Resampling.BILINEAR, box=box)
    elif image.size != out_size:
        image = image.resize(out_size, Image.Resampling.BILINEAR)
    if aug.flip and draws[4 * _CROP_ATTEMPTS] < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_array(image)


def changes_colours(aug: Augment) -> bool:
    """Whether `photometric` changes pixels (else images stay uint8 to the model)."""
    return aug.color_jitter > 0 or aug.noise_std > 0


def photometric(pixels: np.ndarray, aug: Augment, draws: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
    """float32 [B, H, W, C] in [0, 1]: uint8 `pixels` [B, H, W, C] with brightness and
    contrast jitter (each image its own) and Gaussian noise, each on when `aug` says so.

    Args:
      draws: float64 [B, NUM_DRAWS]: each image's `augmented` draws (its last two).
      noise: float32 [B, H, W, C] standard normal draws (used when `aug.noise_std` > 0).
    """
    pixels = pixels.astype(np.float32) / 255.0
    if aug.color_jitter > 0:
        strength = 0.8 * aug.color_jitter
        brightness, contrast = (draws[:, -2:] * 2 - 1).astype(np.float32).T[..., None, None, None]
        pixels = pixels + strength * brightness
        mean = pixels.mean(axis=(1, 2), keepdims=True)
        pixels = (pixels - mean) * (1 + strength * contrast) + mean
    if aug.noise_std > 0:
        pixels = pixels + np.float32(aug.noise_std) * noise
    return np.clip(pixels, 0.0, 1.0, dtype=np.float32)
