"""A small stand-in for MNIST, in MNIST's own files: digits drawn from a font, made the way MNIST's were.

The recipe conformance tests and this recipe's tests train on it (no download, a second or two per
run). Each digit is drawn at a random size, slant and stroke, then put through ``digits.to_mnist``
(cropped, fitted to 20x20, centred by mass in 28x28), so that ``predict.py`` on a PNG of one reads
back the same image.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from project.recipe.digits import to_mnist
from project.recipe.mnist_files import RAW_FILES, raw_folder


def write_idx(path: Path, array: np.ndarray) -> None:
    """``uint8`` data in the IDX format MNIST uses (magic 0x0803 for images, 0x0801 for labels)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def drawn_digit(digit: int, rng: np.random.Generator) -> np.ndarray:
    """One digit as a ``uint8`` 28x28 MNIST-style image."""
    font = ImageFont.load_default(size=int(rng.integers(30, 44)))
    canvas = Image.new("L", (64, 64))
    ImageDraw.Draw(canvas).text((16, 4), str(digit), font=font, fill=255, stroke_width=int(rng.integers(0, 3)),
                                stroke_fill=255)
    slanted = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
    return (to_mnist(slanted)[0].numpy() * 255).round().astype(np.uint8)


def write_example_digits(root: Path, train: int = 320, test: int = 80, seed: int = 0) -> Path:
    """``train`` and ``test`` drawn digits as the four MNIST files under ``root/MNIST/raw/``."""
    rng = np.random.default_rng(seed)
    folder = raw_folder(Path(root))
    folder.mkdir(parents=True, exist_ok=True)
    for (images_name, labels_name), count in ((RAW_FILES[:2], train), (RAW_FILES[2:], test)):
        labels = rng.integers(0, 10, size=count).astype(np.uint8)
        write_idx(folder / images_name, np.stack([drawn_digit(int(k), rng) for k in labels]))
        write_idx(folder / labels_name, labels)
    return Path(root)
