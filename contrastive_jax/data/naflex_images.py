"""NaFlex images (SigLIP 2, Tschannen et al. 2025): each image at its own aspect ratio, as
a variable number of patches up to a token budget (NumPy and PIL, no JAX).

An image is resized so that its patch grid keeps its aspect ratio within the budget
(`size_for_budget`: transformers' `Siglip2ImageProcessor` rule), cut into `patch_size`
patches (`patchify`) and padded to the budget (`pack`). What a batch carries for it is one
array, so that every path that splits, shards or chunks a batch by its rows carries the
grid with its patches::

    a   uint8 [1 + max_num_patches, patch_size * patch_size * C]
        row 0       the header: (rows % 256, rows // 256, cols % 256, cols // 256, 0, ...)
        rows 1..    the image's rows * cols patches in raster order, each its pixels in
                    (y, x, channel) order (transformers' `pixel_values`), then zeros

The model reads the grid from the header (`models.naflex.grid_of`) and masks the padding.
A float array holds the same header (integers) and pixels in [0, 1].
"""

import math

import numpy as np
from PIL import Image

from contrastive_jax.errors import ConfigError

HEADER_ROWS = 1  # rows of the packed array before the patches
HEADER_BASE = 256  # each count is written as two base-256 digits (uint8 holds them)


def size_for_budget(height: int, width: int, patch_size: int, max_num_patches: int) -> tuple[int, int]:
    """`(height, width)` in pixels, multiples of `patch_size`, of an image of `height` x
    `width` resized for at most `max_num_patches` patches at its aspect ratio: the
    largest scale (binary search to 1e-5, as transformers' `Siglip2ImageProcessor`'s
    `get_image_size_for_max_num_patches`) whose rounded-up grid fits, at least one
    patch a side.

    >>> size_for_budget(480, 640, 16, 256)
    (224, 288)
    """

    def scaled(scale: float, size: int) -> int:
        return max(patch_size, math.ceil(size * scale / patch_size) * patch_size)

    low, high, eps = 1e-6, 100.0, 1e-5
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def patchify(pixels: np.ndarray, patch_size: int) -> np.ndarray:
    """`pixels` [H, W, C] (H, W multiples of `patch_size`) as its patches in raster order
    [H / P * W / P, P * P * C], each flattened (y, x, channel)."""
    height, width, channels = pixels.shape
    grid = pixels.reshape(height // patch_size, patch_size, width // patch_size, patch_size, channels)
    return grid.transpose(0, 2, 1, 3, 4).reshape(-1, patch_size * patch_size * channels)


def pack(patches: np.ndarray, grid: tuple[int, int], max_num_patches: int) -> np.ndarray:
    """One image's `patches` [rows * cols, P * P * C] on a `grid` of (rows, cols), as the
    packed array [1 + max_num_patches, P * P * C] (the header, the patches, zeros).

    Raises:
      ConfigError: the grid is over the budget or does not match the patches.
    """
    rows, cols = grid
    if rows * cols > max_num_patches:
        raise ConfigError(
            f"an image of {rows} x {cols} = {rows * cols} patches is over the budget "
            f"config.data.max_num_patches={max_num_patches}: resize it within the budget (naflex_images.resized, "
            "as the input pipeline does) or raise the budget."
        )
    if patches.shape[0] != rows * cols or rows < 1 or cols < 1:
        raise ConfigError(f"{patches.shape[0]} patches do not make a grid of {rows} x {cols}.")
    out = np.zeros((HEADER_ROWS + max_num_patches, patches.shape[1]), patches.dtype)
    out[0, :4] = (rows % HEADER_BASE, rows // HEADER_BASE, cols % HEADER_BASE, cols // HEADER_BASE)
    out[HEADER_ROWS : HEADER_ROWS + rows * cols] = patches
    return out


def grid_of(packed: np.ndarray) -> np.ndarray:
    """int64 [..., 2]: the (rows, cols) of packed arrays [..., 1 + budget, P * P * C]."""
    digits = np.asarray(packed[..., 0, :4], np.int64)
    return digits[..., 0::2] + HEADER_BASE * digits[..., 1::2]


def resized(image: Image.Image, patch_size: int, max_num_patches: int) -> Image.Image:
    """`image` resized (PIL bilinear, as transformers' PIL processor) to
    `size_for_budget`'s size."""
    height, width = size_for_budget(image.height, image.width, patch_size, max_num_patches)
    return image if image.size == (width, height) else image.resize((width, height), Image.Resampling.BILINEAR)


def packed_image(image: Image.Image, patch_size: int, max_num_patches: int) -> np.ndarray:
    """uint8 [1 + max_num_patches, P * P * C]: a PIL image at its aspect ratio within the
    budget (`resized`), patchified and packed."""
    pixels = np.asarray(resized(image, patch_size, max_num_patches), np.uint8)
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    grid = (pixels.shape[0] // patch_size, pixels.shape[1] // patch_size)
    return pack(patchify(pixels, patch_size), grid, max_num_patches)
