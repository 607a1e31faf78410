"""A generated image-text dataset of any size: pictures of 1-3 coloured shapes, each with
captions that describe them, drawn from a seed (the built-in dataset `shapes`).

Picture `i` of a set with seed `s` is a pure function of `(s, i)`: on a plain background
of one of `BACKGROUNDS`, 1-3 shapes (`KINDS`), each with a colour (`COLOURS`), a size
(small or large) and a cell of a 3 x 3 grid (top left ... center ... bottom right), no two
in one cell. Its 4 captions name the same facts in different words and orders:

    "a large red circle at the top left and a small blue square in the center"
    "two shapes: a red circle (large, top left) and a blue square (small, center)"
    "a picture with 2 shapes on a grey background"  ... and a shorter one.

So retrieval is learnable from the pixels, the nearest wrong caption differs in a single
attribute (a hard negative), and a counting or layout detail separates near-duplicates:
the ceiling is not reached at once. `label` is the first shape's kind. Splits: `train`,
`validation` and `test` hold 90%, 5% and 5% of the pictures (`split_sizes`).
"""

import dataclasses
import io

import numpy as np
from PIL import Image, ImageDraw

KINDS = ("circle", "square", "triangle", "cross", "diamond")
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 180),
    "orange": (240, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
BACKGROUNDS = {"grey": (128, 128, 128), "brown": (110, 80, 50), "teal": (40, 120, 120)}
ROWS, COLUMNS = ("top", "middle", "bottom"), ("left", "center", "right")
SIZES = {"small": 0.18, "large": 0.3}  # radius as a fraction of the picture's side
COUNT_WORDS = ("one", "two", "three")
SPLIT_FRACTIONS = {"train": 0.9, "validation": 0.05, "test": 0.05}
CAPTIONS_PER_PICTURE = 4


@dataclasses.dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: str
    row: int
    column: int

    @property
    def place(self) -> str:
        if (self.row, self.column) == (1, 1):
            return "the center"
        if self.row == 1:
            return f"the {COLUMNS[self.column]}"
        if self.column == 1:
            return f"the {ROWS[self.row]}"
        return f"the {ROWS[self.row]} {COLUMNS[self.column]}"


def split_sizes(num_examples: int) -> dict[str, int]:
    """The number of pictures of each split (`train` takes the rounding)."""
    validation = test = max(1, round(num_examples * SPLIT_FRACTIONS["test"]))
    return {"train": num_examples - validation - test, "validation": validation, "test": test}


def draw_shapes(seed: int, index: int) -> tuple[str, list[Shape]]:
    """The background and shapes of picture `index` of the set with `seed`."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    cells = rng.permutation(9)[: rng.integers(1, 4)]
    shapes = [
        Shape(
            kind=KINDS[rng.integers(len(KINDS))],
            colour=list(COLOURS)[rng.integers(len(COLOURS))],
            size=list(SIZES)[rng.integers(len(SIZES))],
            row=int(cell // 3),
            column=int(cell % 3),
        )
        for cell in cells
    ]
    return list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))], shapes


def picture(background: str, shapes: list[Shape], size: int) -> Image.Image:
    """The RGB picture of `shapes` on `background`, `size` x `size` pixels."""
    image = Image.new("RGB", (size, size), BACKGROUNDS[background])
    pen = ImageDraw.Draw(image)
    for shape in shapes:
        cx, cy = (shape.column + 0.5) * size / 3, (shape.row + 0.5) * size / 3
        r = SIZES[shape.size] * size / 2
        colour = COLOURS[shape.colour]
        if shape.kind == "circle":
            pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        elif shape.kind == "square":
            pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
        elif shape.kind == "triangle":
            pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
        elif shape.kind == "diamond":
            pen.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
        else:  # cross
            w = r / 3
            pen.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
            pen.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
    return image


def captions(background: str, shapes: list[Shape]) -> list[str]:
    """`CAPTIONS_PER_PICTURE` descriptions of the same picture, in different words."""
    full = " and ".join(f"a {s.size} {s.colour} {s.kind} at {s.place}" for s in shapes)
    listed = ", ".join(f"a {s.colour} {s.kind} ({s.size}, {s.place[4:]})" for s in shapes)
    count = len(shapes)
    noun = "shape" if count == 1 else "shapes"
    kinds = " and ".join(f"{s.colour} {s.kind}" for s in reversed(shapes))
    return [
        full,
        f"{COUNT_WORDS[count - 1]} {noun}: {listed}",
        f"a picture with {count} {noun} on a {background} background: {kinds}",
        f"{kinds} on {background}",
    ]


@dataclasses.dataclass(frozen=True)
class Shapes:
    """A generated set: `num_examples` pictures of `image_size` px from `seed`, encoded
    as `image_format` ("png" or "jpeg")."""

    num_examples_total: int = 10_000
    seed: int = 0
    image_size: int = 64
    image_format: str = "png"

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", "label"), "class_names": KINDS, "image_channels": 3}

    @property
    def options(self) -> dict:
        """The `write_records` flags that made the set."""
        return {
            "num_examples": self.num_examples_total,
            "seed": self.seed,
            "image_size": self.image_size,
            "encode": self.image_format,
        }

    def num_examples(self, split: str) -> int:
        return split_sizes(self.num_examples_total)[split]

    def label_counts(self, split: str) -> None:
        """None: the labels are class ids (`KINDS.index`)."""
        return None

    def splits(self) -> tuple[str, ...]:
        return tuple(SPLIT_FRACTIONS)

    def examples(self, split: str, start: int, stop: int):
        """Records `start` to `stop` of `split`: `image`, `captions`, `label`."""
        sizes = split_sizes(self.num_examples_total)
        offset = sum(sizes[s] for s in list(sizes)[: list(sizes).index(split)])
        for index in range(offset + start, offset + stop):
            background, shapes = draw_shapes(self.seed, index)
            encoded = io.BytesIO()
            picture(background, shapes, self.image_size).save(
                encoded, "JPEG" if self.image_format == "jpeg" else "PNG", quality=95
            )
            yield {
                "image": encoded.getvalue(),
                "captions": captions(background, shapes),
                "label": KINDS.index(shapes[0].kind),
            }
