"""A class-per-folder tree of images on disk (``data=image_folder``, ImageNet's train/): its
classes and (path, label) samples, `scan_folder`. Hidden files and folders are no samples;
folders linked inside a class folder are read (as torchvision's ImageFolder reads them), each
real folder once; links that would put an image in two classes, or that lead nowhere, are
refused by name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from expctl.builtin.datasets import preflight
from expctl.errors import UserError

log = logging.getLogger("expctl")

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")


def scan_folder(
    folder: Path, extensions: Sequence[str], held_out: bool = False, on_corrupt: str = "error"
) -> tuple[list[str], list[tuple[str, int]]]:
    """Class names (sorted sub-folders) and (path, label) samples of a class-per-folder tree
    (`held_out`: a validation or test folder, which the run can do without); an image that is a
    broken symbolic link is refused, or left out with a warning (`on_corrupt`: error or skip)."""
    if not folder.is_dir():
        raise UserError(
            f"data.root: {folder} is not a folder",
            "point data.root at a folder of class sub-folders (or of train/ and val/ ones)",
        )
    preflight.refuse_broken_links(folder, None, "a class left out would change the labels")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(
            f"data.root: {folder} holds no class folders",
            "lay images out as ROOT/CLASS/IMAGE.jpg (one sub-folder per class)"
            + (
                "; or validate on part of train (data.val_split=0.1), or not at all (data.val=null)"
                if held_out
                else ""
            ),
        )
    reals = _refuse_linked_twice(folder, classes)
    samples, empty, broken = [], [], []
    for label, name in enumerate(classes):
        others = {real: other for real, other in reals.items() if other != name}
        found = _images_under(folder / name, extensions, others)
        files = sorted(str(p) for p in found if p.is_file())
        broken += sorted(p for p in found if p.is_symlink() and not p.exists())  # is_file: False
        if not files:
            empty.append(name)
        samples += [(f, label) for f in files]
    if broken:
        _broken_images(broken, on_corrupt)
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise UserError(
            f"data.root: class folder(s) {shown} in {folder} hold no images "
            f"({', '.join(extensions)})",
            "remove the empty class folders, or add images to them",
        )
    return classes, samples


def _refuse_linked_twice(folder: Path, classes: Sequence[str]) -> dict[str, str]:
    """No class folder is (a link to) the folder of classes or one above it, nor the same
    folder as another class: its images would be every class's, or two classes' at once.
    Returns each class folder's real path -> its class.

    Raises:
        UserError: naming the class folder and where it leads.
    """
    start, real_of = os.path.realpath(folder), dict[str, str]()
    for name in classes:
        real = os.path.realpath(folder / name)
        if os.path.commonpath([start, real]) == real:
            raise UserError(
                f"data.root: class folder {folder / name} leads to {real}, which holds the "
                "class folders themselves (a link back up the tree)",
                f"remove the link {folder / name}",
            )
        if real in real_of:
            raise UserError(
                f"data.root: class folders {real_of[real]} and {name} in {folder} are the same "
                f"folder ({real}): its images would be in two classes",
                "remove one of the two links",
            )
        real_of[real] = name
    return real_of


def _images_under(
    top: Path, extensions: Sequence[str], others: dict[str, str] | None = None
) -> list[Path]:
    """The files under `top` with one of `extensions`. Links to folders are followed (as
    torchvision's ImageFolder does: a class assembled from linked folders), each real folder read
    once, none above `top` (a link back up the tree ends there); hidden ones (macOS's ._x.jpg,
    .ipynb_checkpoints/) are no samples.

    Raises:
        UserError: a linked folder leads into the folder of another class (`others`: real path
            -> class), whose images would be in two classes.
    """
    seen: set[str] = set()
    found = []
    start = os.path.realpath(top)
    for root, dirs, names in os.walk(top, followlinks=True):
        real = os.path.realpath(root)
        above = real != start and os.path.commonpath([start, real]) == real  # "/" too
        inside = next((o for o in others or {} if os.path.commonpath([o, real]) == o), None)
        if inside is not None:
            raise UserError(
                f"data.root: {root} (in class folder {top.name}) leads to {real}, the folder of "
                f"class {(others or {})[inside]}: its images would be in two classes",
                f"remove the link {root}",
            )
        if real in seen or above:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [
            Path(root, n)
            for n in names
            if not n.startswith(".") and os.path.splitext(n)[1].lower() in extensions
        ]
    return found


def _broken_images(broken: Sequence[Path], on_corrupt: str) -> None:
    """Images that are symbolic links to nothing (an unmounted disk, a moved folder): no file to
    read, so corrupt ones, refused at the scan or (on_corrupt=skip) left out, said once."""
    why = "an image that cannot be read"
    if on_corrupt != "skip":
        raise preflight.broken_links(broken, why, ", or set data.on_corrupt=skip to leave it out")
    shown = ", ".join(f"{p} (to {os.readlink(p)})" for p in broken[:3])
    more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
    log.warning(
        "skipped %d image(s) that are broken symbolic links: %s%s", len(broken), shown, more
    )
