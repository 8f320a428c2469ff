"""Writes real MNIST test digits as ordinary image files, the way a user's scans would look."""

import random
from pathlib import Path

from PIL import Image
from torchvision import datasets


def write_transformed_digits(data_dir: Path, out: Path, count: int = 200, seed: int = 0) -> dict[str, int]:
    """PNG/JPEG, grayscale/RGB/RGBA, either polarity, other sizes, padded and off-centre.

    Returns file name -> true label.
    """
    rng = random.Random(seed)
    test = datasets.MNIST(data_dir, train=False)
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for index in range(count):
        digit = Image.fromarray(test.data[index].numpy(), mode="L")
        dark_on_light = rng.random() < 0.5
        if dark_on_light:
            digit = Image.eval(digit, lambda v: 255 - v)
        side = rng.randint(40, 160)
        digit = digit.resize((side, side), Image.Resampling.BICUBIC)
        canvas_w, canvas_h = side + rng.randint(0, 120), side + rng.randint(0, 120)
        paper = 255 if dark_on_light else 0
        canvas = Image.new("L", (canvas_w, canvas_h), paper)
        canvas.paste(digit, (rng.randint(0, canvas_w - side), rng.randint(0, canvas_h - side)))
        kind = rng.choice(["png-gray", "png-rgb", "png-rgba", "jpeg"])
        name = f"digit{index:03d}"
        if kind == "png-gray":
            canvas.save(out / f"{name}.png")
        elif kind == "png-rgb":
            canvas.convert("RGB").save(out / f"{name}.png")
        elif kind == "png-rgba":
            rgba = canvas.convert("RGBA")
            ink = canvas if not dark_on_light else Image.eval(canvas, lambda v: 255 - v)
            rgba.putalpha(ink)  # paper transparent, strokes opaque
            rgba.save(out / f"{name}.png")
        else:
            canvas.convert("RGB").save(out / f"{name}.jpg", quality=90)
        labels[next(out.glob(f"{name}.*")).name] = int(test.targets[index])
    return labels
