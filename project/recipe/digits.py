"""Turn an arbitrary photo or scan of a digit into an MNIST-style 28x28 image."""

from __future__ import annotations

import os

import torch
from PIL import Image

from project.api import ImageError, TensorDataModule
from project.recipe.mnist_files import MNIST_MEAN, MNIST_STD

INK_THRESHOLD = 0.2  # after contrast stretching, pixels above this count as the digit


def _grayscale(image: Image.Image) -> torch.Tensor:
    """Luminance in [0, 1]; transparent areas take the colour that contrasts with the ink."""
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        alpha = torch.frombuffer(bytearray(rgba.getchannel("A").tobytes()), dtype=torch.uint8).float()
        gray = torch.frombuffer(bytearray(rgba.convert("L").tobytes()), dtype=torch.uint8).float()
        ink_is_dark = (gray * alpha).sum() / alpha.sum().clamp(min=1) < 128
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255) if ink_is_dark else (0, 0, 0, 255))
        image = Image.alpha_composite(background, rgba)
    gray = image.convert("L")
    pixels = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).float().div(255)
    return pixels.reshape(gray.height, gray.width)


def to_mnist(image: Image.Image) -> torch.Tensor:
    """MNIST's own recipe: light digit on black, cropped to its bounding box, scaled to fit 20x20,
    then placed in 28x28 with its centre of mass at the centre (as MNIST was made; centring the
    box instead shifts digits by a pixel or two, which costs an MLP several points of accuracy).
    Returns ``(1, 28, 28)`` pixels in [0, 1]."""
    pixels = _grayscale(image)
    border = torch.cat([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    if border.median() > 0.5:  # dark ink on light paper: turn it into MNIST's polarity
        pixels = 1 - pixels
        border = 1 - border
    background, peak = border.median(), pixels.max()
    if peak - background < 0.1:
        raise ImageError("no digit found (the image is blank or has no contrast)")
    pixels = ((pixels - background) / (peak - background)).clamp(0, 1)
    rows = torch.nonzero((pixels > INK_THRESHOLD).any(dim=1)).flatten()
    cols = torch.nonzero((pixels > INK_THRESHOLD).any(dim=0)).flatten()
    digit = pixels[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1]
    height, width = digit.shape
    scale = 20 / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    as_image = Image.fromarray((digit * 255).round().to(torch.uint8).numpy(), mode="L")
    resized = as_image.resize(size, Image.Resampling.LANCZOS)
    small = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8).float().div(255)
    small = small.reshape(size[1], size[0])
    mass = small.sum().clamp(min=1e-6)
    centre_y = float((small.sum(dim=1) * torch.arange(size[1])).sum() / mass)
    centre_x = float((small.sum(dim=0) * torch.arange(size[0])).sum() / mass)
    top = min(max(round(13.5 - centre_y), 0), 28 - size[1])
    left = min(max(round(13.5 - centre_x), 0), 28 - size[0])
    canvas = torch.zeros(28, 28)
    canvas[top: top + size[1], left: left + size[0]] = small
    return canvas.unsqueeze(0)


def load_digit(path: str | os.PathLike) -> torch.Tensor:
    """A file as a normalised ``(1, 28, 28)`` tensor, or one clear reason why not."""
    return (TensorDataModule.open_image(path, to_mnist) - MNIST_MEAN) / MNIST_STD
