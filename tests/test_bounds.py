"""Bounded reads (issue 12): YAML files (size, alias bombs) and compressed data files (gzip
bombs) are refused with a one-line UserError naming the file and the limit, before anything
expands them."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from expctl.config import compose, yamlfile
from expctl.config import frozen as config
from expctl.errors import UserError


def alias_bomb(fan: int, levels: int) -> str:
    """`levels` anchors, each `fan` aliases of the one before: fan**levels strings."""
    names = "abcdefghijklmnopqrstuvwxyz"
    text = f"a: &a [{', '.join(['lol'] * fan)}]\n"
    for prev, name in zip(names[: levels - 1], names[1:levels], strict=True):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * fan)}]\n"
    return text


# 2**15 strings in 300 bytes: today's reader took seconds to expand it, then failed elsewhere
SMALL_BOMB = alias_bomb(2, 15)


def test_an_alias_bomb_in_a_group_file_next_to_the_config_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "fast.yaml").write_text("name: sgd\n" + SMALL_BOMB)
    (tmp_path / "my.yml").write_text("train: {max_epochs: 1}\n")
    with pytest.raises(UserError, match=r"fast\.yaml: more than 10000 values once its aliases"):
        compose.compose(str(tmp_path / "my.yml"), ["optim=fast"], check_components=False)


def test_a_run_config_read_back_is_bounded(tmp_path: Path) -> None:
    """config.load (expctl status, load_model, workers) reads RUN_DIR/config.yaml the same way."""
    (tmp_path / "config.yaml").write_text(SMALL_BOMB)
    with pytest.raises(UserError, match=r"config\.yaml: more than 10000 values"):
        config.load(tmp_path)
    (tmp_path / "config.yaml").write_text("#\n" * (yamlfile.YAML_MAX_BYTES // 2 + 1))
    with pytest.raises(UserError, match=r"config\.yaml: the file is larger than 1 MiB"):
        config.load(tmp_path)


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.yml").write_text("train: &t {max_epochs: 2, again: *t}\n")
    with pytest.raises(UserError, match="recursive alias") as e:
        compose.compose(str(tmp_path / "r.yml"), check_components=False)
    assert "\n" not in e.value.message


def test_aliases_within_the_bound_still_work(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("train: {max_epochs: &n 4, val_every: *n}\n")
    cfg = compose.compose(str(tmp_path / "a.yml"), check_components=False)
    assert (cfg.train.max_epochs, cfg.train.val_every) == (4, 4)


def _idx_gz(path: Path, dims: tuple[int, ...], body: int, extra_mib: int = 0) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b"\x00\x00\x08" + bytes([len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims))
        f.write(b"\x00" * body)
        for _ in range(extra_mib):
            f.write(bytes(1 << 20))
    return path


def test_a_gzip_bomb_is_read_only_as_far_as_its_header_declares(tmp_path: Path) -> None:
    """A small .gz whose stream goes on past what its header declares (48 MiB here, GiBs in
    the wild) is refused after reading the declared bytes, never read whole."""
    from expctl.builtin.datasets import idx as data

    path = _idx_gz(tmp_path / "train-images-idx3-ubyte.gz", (10, 28, 28), 7840, extra_mib=48)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"train-images-idx3-ubyte\.gz is truncated or corrupt"):
            data.read_idx(path, data.IDX_SHAPES["train_x"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"read {peak} bytes of a 10-image file"


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        ((10**9, 28, 28), r"declares 1000000000 x 28 x 28, expected N x 28 x 28 with N <= 60000"),
        ((10, 280, 280), r"declares 10 x 280 x 280, expected N x 28 x 28"),
        ((10,), r"not an IDX file of images"),
    ],
)
def test_an_idx_header_beyond_fashion_mnist_is_refused_before_reading(
    tmp_path: Path, dims: tuple[int, ...], expected: str
) -> None:
    from expctl.builtin.datasets import idx as data

    path = _idx_gz(tmp_path / "train-images-idx3-ubyte.gz", dims, 16)
    with pytest.raises(UserError, match=expected) as e:
        data.read_idx(path, data.IDX_SHAPES["train_x"])
    assert str(path) in e.value.message


def test_the_real_fashion_mnist_files_are_read_whole() -> None:
    from expctl.builtin.datasets import idx as data

    try:
        files = data.find_idx("fashion_mnist", None)
    except UserError:
        pytest.skip("Fashion-MNIST is not installed (.ci/setup installs it)")
    x = data.read_idx(files["val_x"], data.IDX_SHAPES["val_x"])
    y = data.read_idx(files["val_y"], data.IDX_SHAPES["val_y"])
    assert tuple(x.shape) == (10000, 28, 28) and tuple(y.shape) == (10000,)


def test_a_gz_is_decoded_once_then_read_from_its_checked_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from expctl.builtin.datasets import idx as data

    monkeypatch.setenv("EXPCTL_CACHE_DIR", str(tmp_path / "cache"))
    path = _idx_gz(tmp_path / "train-images-idx3-ubyte.gz", (10, 28, 28), 7840)
    first = data.read_idx(path, data.IDX_SHAPES["train_x"])
    (copy,) = (tmp_path / "cache" / "data").iterdir()
    assert copy.read_bytes()[16:] == bytes(7840)
    copy.write_bytes(copy.read_bytes()[:16] + bytes([7]) * 7840)  # proof the copy is what's read
    assert int(data.read_idx(path, data.IDX_SHAPES["train_x"]).sum()) == 7 * 7840
    copy.write_bytes(copy.read_bytes()[:100])  # damaged: the .gz is decoded again, the copy made
    assert data.read_idx(path, data.IDX_SHAPES["train_x"]).equal(first)
    assert copy.stat().st_size == 16 + 7840
    os.utime(path, ns=(1, 1))  # the .gz changed: decoded again, the old copy replaced
    data.read_idx(path, data.IDX_SHAPES["train_x"])
    assert [p.name for p in copy.parent.iterdir()] != [copy.name]
    assert len(list(copy.parent.iterdir())) == 1
    with pytest.raises(UserError, match=r"declares 10 x 28 x 28, expected N x 28 x 28 with N <= 5"):
        data.read_idx(path, (5, 28, 28))  # a limit the file exceeds: refused, copy or not


@pytest.mark.slow
def test_a_cache_write_that_fails_midway_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A full disk (here: a file-size limit, in a child process) stops the decoded copy's write
    part way: the run still gets its data, and no partial temporary file is left behind."""
    path = _idx_gz(tmp_path / "train-images-idx3-ubyte.gz", (10, 28, 28), 7840)
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from expctl.builtin.datasets import idx\n"
        f"x = idx.read_idx(Path({str(path)!r}), idx.IDX_SHAPES['train_x'])\n"
        "print(tuple(x.shape))\n"
    )
    env = {**os.environ, "EXPCTL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "(10, 28, 28)"
    assert list((tmp_path / "cache" / "data").iterdir()) == []  # no copy, no .tmp
