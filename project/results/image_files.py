"""Image files as network inputs: which files, opened with one clear reason when one cannot be used."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from project.errors import ImageError

T = TypeVar("T")


def with_image(path: str | os.PathLike, use: Callable[[Image.Image], T]) -> T:
    """``use(image)`` on the decoded file (EXIF rotation applied), or ``ImageError`` in one line."""
    path = Path(path)
    if path.is_dir():
        raise ImageError("is a directory")
    try:
        with Image.open(path) as image:
            image.load()
            return use(ImageOps.exif_transpose(image))
    except FileNotFoundError:
        raise ImageError("no such file") from None
    except PermissionError:
        raise ImageError("no permission to read it") from None
    except UnidentifiedImageError:
        raise ImageError("not an image file (or a format Pillow cannot read)") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot decode the image ({str(err).splitlines()[0][:100] or type(err).__name__})") from None


def read_resized(path: str | os.PathLike, shape: tuple[int, ...]) -> torch.Tensor:
    """``[0, 1]`` pixels ``(C, H, W)`` of ``shape``: grey for one channel, RGB for three, resized to fit."""
    channels, height, width = shape

    def pixels(image: Image.Image) -> torch.Tensor:
        mode = {1: "L", 3: "RGB"}.get(channels)
        if mode is None:
            raise ImageError(f"the recipe's inputs have {channels} channels; only 1 (grey) or 3 (RGB) come from images")
        resized = image.convert(mode).resize((width, height), Image.Resampling.BILINEAR)
        values = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8).float().div(255)
        return values.reshape(height, width, channels).permute(2, 0, 1).contiguous()

    return with_image(path, pixels)


def image_files(inputs: list[str]) -> list[Path]:
    """Files named directly, plus every file in named directories (sorted, not recursive)."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.iterdir() if p.is_file() and not p.name.startswith("."))
        else:
            files.append(item)
    return files
