"""The four MNIST files in IDX format: where they are, and one clear line for whatever is wrong with them."""

from __future__ import annotations

from pathlib import Path

from project.api import DataError, not_a_regular_file

RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # of the training images' pixels in [0, 1]
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801  # IDX: unsigned bytes, 3 or 1 dimensions


def raw_folder(data_dir: Path) -> Path:
    return data_dir / "MNIST" / "raw"


def missing_files(data_dir: Path) -> list[str]:
    """The files not there at all (a link that leads nowhere is there: the check names it)."""
    folder = raw_folder(data_dir)
    return [name for name in RAW_FILES if not (folder / name).exists() and not (folder / name).is_symlink()]


def ensure_mnist(data_dir: Path, download: bool) -> None:
    """Download MNIST only when a file is missing; explain what is needed when that fails; check the files."""
    try:
        _ensure_mnist(data_dir, download)
    except PermissionError as err:
        raise DataError(f"{err.filename or raw_folder(data_dir)}: no permission to read it") from None


def _ensure_mnist(data_dir: Path, download: bool) -> None:
    if missing_files(data_dir) and download:
        from torchvision import datasets

        try:
            for train in (True, False):
                datasets.MNIST(data_dir, train=train, download=True)
        except Exception:  # noqa: BLE001 - any failure means the same thing to the user
            pass
    if missing_files(data_dir):
        raise DataError(
            f"MNIST not found in {raw_folder(data_dir)} and it could not be downloaded; "
            f"put the four uncompressed files there ({', '.join(RAW_FILES)}) "
            "or point --data-dir / DATA_DIR at a folder that has MNIST/raw/"
        )
    check_raw_files(data_dir)


def check_raw_files(data_dir: Path) -> None:
    """Raise one clear line for the first unusable MNIST file, before torchvision reads them."""
    folder = raw_folder(data_dir)
    for images_name, labels_name in (RAW_FILES[:2], RAW_FILES[2:]):
        counts = []
        for name, magic in ((images_name, IMAGES_MAGIC), (labels_name, LABELS_MAGIC)):
            problem, count = idx_problem(folder / name, magic)
            if problem:
                raise DataError(f"{folder / name}: {problem}")
            counts.append(count)
        if counts[0] != counts[1]:
            raise DataError(
                f"{folder / images_name} has {counts[0]} images but {folder / labels_name} has {counts[1]} labels"
            )


def idx_problem(path: Path, magic: int) -> tuple[str | None, int]:
    """What is wrong with one IDX file (None if nothing), and the record count its header gives."""
    problem = not_a_regular_file(path)
    if problem:
        return problem, 0
    try:
        with path.open("rb") as stream:
            header = stream.read(4 + 4 * 3)
    except PermissionError:
        return "cannot read it (permission denied)", 0
    except OSError as err:
        return f"cannot read it ({err.strerror or err})", 0
    size = path.stat().st_size
    if size == 0:
        return "empty file", 0
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    if size < header_size:
        return f"truncated: {size} bytes, shorter than the {header_size}-byte IDX header", 0
    found = int.from_bytes(header[:4], "big")
    if found != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        return f"wrong magic number 0x{found:08x}, expected 0x{magic:08x} (IDX {kind} of unsigned bytes)", 0
    dims = [int.from_bytes(header[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    if ndim == 3 and dims[1:] != [28, 28]:
        return f"images are {dims[1]}x{dims[2]}, expected 28x28", dims[0]
    expected = header_size + dims[0] * (28 * 28 if ndim == 3 else 1)
    if size != expected:
        state = "truncated" if size < expected else "too long"
        return f"{state}: {size} bytes, but its header announces {dims[0]} records ({expected} bytes)", dims[0]
    return None, dims[0]


def label_problem(data_dir: Path, train: bool, largest_label: int, classes: int) -> None:
    """Labels outside the classes the model predicts: named with the file they came from."""
    if largest_label >= classes:
        name = RAW_FILES[1] if train else RAW_FILES[3]
        raise DataError(f"{raw_folder(data_dir) / name}: label {largest_label} is not a digit 0-{classes - 1}")
