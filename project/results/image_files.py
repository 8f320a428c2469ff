"""Image files as network inputs: which files, opened with one clear reason when one cannot be used."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from project.errors import ImageError, UsageError, first_line, not_a_regular_file

T = TypeVar("T")


def with_image(path: str | os.PathLike, use: Callable[[Image.Image], T]) -> T:
    """``use(image)`` on the decoded file (EXIF rotation applied, 16-bit and float pixels scaled to 8 bits), or
    ``ImageError`` in one line. Only regular files are opened (a FIFO would block), and images larger than
    Pillow's decompression-bomb limit are refused before they are decoded."""
    path = Path(path)
    problem = not_a_regular_file(path)
    if problem:
        raise ImageError(problem)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                return use(eight_bit(ImageOps.exif_transpose(image)))
    except FileNotFoundError:
        raise ImageError("no such file") from None
    except PermissionError:
        raise ImageError("no permission to read it") from None
    except UnidentifiedImageError:
        raise ImageError("not an image file (or a format Pillow cannot read)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"too large to decode (more than {Image.MAX_IMAGE_PIXELS:,} pixels)") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot decode the image ({first_line(err)})") from None


def eight_bit(image: Image.Image) -> Image.Image:
    """16-bit, 32-bit and float grey images as 8-bit grey, scaled rather than clipped: Pillow's own conversion
    clips 16-bit scans at 255 and turns float pixels in [0, 1] black."""
    if image.mode not in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        return image
    values = torch.frombuffer(bytearray(image.convert("F").tobytes()), dtype=torch.float32)
    if image.mode == "F":
        top = 1.0 if len(values) and float(values.max()) <= 1.0 else 255.0
    elif image.mode.startswith("I;16"):
        top = 65535.0
    else:  # 32-bit integers: the range the values use
        top = 65535.0 if len(values) and float(values.max()) > 255 else 255.0
    scaled = (values.clamp(0, top) * (255 / top)).round().to(torch.uint8)
    return Image.frombytes("L", image.size, scaled.numpy().tobytes())


def read_resized(path: str | os.PathLike, shape: tuple[int, ...], dark_background: bool | None = None) -> torch.Tensor:
    """``[0, 1]`` pixels ``(C, H, W)`` of ``shape``: grey for one channel, RGB for three, resized to fit.

    A larger image is shrunk by area (box) averaging, which gives an exact upscale's original pixels
    back and blurs nothing it need not; a smaller one is enlarged bilinearly. ``dark_background``:
    the polarity of the images the network was trained on (True: light on dark); an image
    of the other polarity (its mean brightness on the other side of one half) is inverted, so that
    dark ink on light paper reads as the light-on-dark strokes the network knows.
    """
    channels, height, width = shape

    def pixels(image: Image.Image) -> torch.Tensor:
        mode = {1: "L", 3: "RGB"}.get(channels)
        if mode is None:
            raise ImageError(f"the recipe's inputs have {channels} channels; only 1 (grey) or 3 (RGB) come from images")
        converted = image.convert(mode)
        shrinking = converted.width >= width and converted.height >= height
        resized = converted.resize((width, height), Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR)
        values = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8).float().div(255)
        values = values.reshape(height, width, channels).permute(2, 0, 1).contiguous()
        if dark_background is not None and bool(values.mean() > 0.5) == dark_background:
            values = 1 - values
        return values

    return with_image(path, pixels)


def files_in(folder: Path) -> list[Path]:
    """The files directly in ``folder`` that a user means: sorted, hidden ones left out."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def image_files(inputs: list[str]) -> list[Path]:
    """Files named directly, plus every file in named directories (sorted, not recursive); a folder with no file in
    it is one line (``UsageError``): nothing classified must not read as success."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = files_in(item)
            if not found:
                raise UsageError(f"{item}: no files in this folder (predict.py reads the files directly in it, not "
                                 "in its subfolders)")
            files += found
        else:
            files.append(item)
    return files
