"""`expctl show` keeps its composition (config/kept.py): served again only while every file it
came from is as it was, with the checks that may change rerun each time. Real CLI processes,
each in a fresh interpreter: what a user types."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TINY, cli_env, image_tree

# the CLI, reporting on stderr whether Hydra composed (else the composition was kept)
PROBE = """\
import sys
from expctl import cli
sys.argv = ["expctl", *sys.argv[1:]]
try:
    rc = cli.main()
finally:
    print("composed" if "hydra" in sys.modules else "kept", file=sys.stderr)
sys.exit(rc)
"""


def show(cwd: Path, cache: Path, *args: str, **env: str) -> tuple[int, str, str]:
    """(exit code, stdout, how) of `expctl show ARGS` in `cwd`, with its own cache folder."""
    p = subprocess.run(
        [sys.executable, "-c", PROBE, "show", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=cli_env(EXPCTL_CACHE_DIR=str(cache), **env),
        timeout=120,
    )
    how = p.stderr.strip().splitlines()[-1]
    return p.returncode, p.stdout if p.returncode == 0 else p.stderr, how


def test_show_is_kept_until_a_file_it_read_or_looked_for_changes(tmp_path: Path) -> None:
    cache, cfg = tmp_path / "cache", tmp_path / "exp.yml"
    cfg.write_text(TINY)
    first = show(tmp_path, cache, "-C", "exp.yml", "optim=sgd")
    assert first[0] == 0 and first[2] == "composed", first
    again = show(tmp_path, cache, "-C", "exp.yml", "optim=sgd")
    assert again == (0, first[1], "kept")
    # another command line, another composition
    assert show(tmp_path, cache, "-C", "exp.yml", "optim=sgd", "optim.lr=0.2")[2] == "composed"
    # the -C file edited
    cfg.write_text(TINY.replace("lr: 0.1,", "lr: 0.05,"))
    edited = show(tmp_path, cache, "-C", "exp.yml", "optim=sgd")
    assert edited[2] == "composed" and "lr: 0.05" in edited[1]
    # a file the composition looked for and did not find: optim/sgd.yaml beside the -C file
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "sgd.yaml").write_text("name: sgd\nlr: 0.123\n")
    shadowed = show(tmp_path, cache, "-C", "exp.yml", "optim=sgd")
    assert shadowed[2] == "composed" and "lr: 0.123" in shadowed[1], shadowed
    assert show(tmp_path, cache, "-C", "exp.yml", "optim=sgd") == (0, shadowed[1], "kept")
    # the same command line from another directory: relative paths would name other files
    other = tmp_path / "other"
    other.mkdir()
    assert show(other, cache, "-C", "../exp.yml", "optim=sgd")[2] == "composed"


def test_a_kept_show_checks_the_files_a_config_names_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    images = image_tree(tmp_path / "images")
    init = tmp_path / "weights.pt"
    init.write_bytes(b"not read by show")
    args = ("data=image_folder", f"data.root={images}", "data.val_split=0.25")
    args += (f"checkpoint.init={init}",)
    assert show(tmp_path, cache, *args)[::2] == (0, "composed")
    assert show(tmp_path, cache, *args)[::2] == (0, "kept")
    init.unlink()
    rc, err, how = show(tmp_path, cache, *args)
    assert (rc, how) == (2, "kept") and "checkpoint.init: nothing at" in err, err
    init.write_bytes(b"back")
    shutil.rmtree(images)
    rc, err, how = show(tmp_path, cache, *args)
    assert (rc, how) == (2, "kept") and str(images) in err and "Traceback" not in err, err


def test_what_reads_the_environment_or_fails_is_never_kept(tmp_path: Path) -> None:
    cache, cfg = tmp_path / "cache", tmp_path / "exp.yml"
    cfg.write_text(TINY.replace("max_epochs: 2", "max_epochs: '${oc.env:EPOCHS}'"))
    for epochs in ("3", "3", "x"):
        rc, out, how = show(tmp_path, cache, "-C", "exp.yml", EPOCHS=epochs)
        assert how == "composed" and rc == (0 if epochs == "3" else 2), out
    assert "Traceback" not in out
    for _ in range(2):  # a bad value: an error each time, and nothing kept
        rc, out, how = show(tmp_path, cache, "-C", "exp.yml", "optim.lr=fast", EPOCHS="3")
        assert (rc, how) == (2, "composed") and "optim.lr" in out, out
    assert not list((cache / "show").glob("*")), "nothing is kept"


def test_kept_compositions_are_bounded(tmp_path: Path) -> None:
    """Writing one removes the oldest beyond KEEP, whatever they were kept for."""
    from expctl.config import kept

    cache = tmp_path / "cache"
    folder = cache / "show"
    folder.mkdir(parents=True)
    for i in range(kept.KEEP):
        old = folder / f"old{i:03d}.json"
        old.write_text("{}")
        os.utime(old, ns=(i * 10**9, i * 10**9))
    (tmp_path / "exp.yml").write_text(TINY)
    assert show(tmp_path, cache, "-C", "exp.yml")[::2] == (0, "composed")
    left = sorted(p.name for p in folder.glob("*.json"))
    assert len(left) == kept.KEEP and "old000.json" not in left and "old001.json" in left
    new = [p for p in folder.glob("*.json") if not p.name.startswith("old")]
    assert len(new) == 1 and json.loads(new[0].read_text())["files"]


def test_a_resolver_in_a_value_or_a_damaged_entry_composes_afresh(tmp_path: Path) -> None:
    """`${now:...}` is resolved while composing (its value differs next time): never kept. A
    kept entry that does not read back whole is composed again, not a traceback."""
    cache, cfg = tmp_path / "cache", tmp_path / "exp.yml"
    cfg.write_text(TINY + "run: {name: 'exp-${now:%H%M%S%f}'}\n")
    names = set()
    for _ in range(2):
        rc, out, how = show(tmp_path, cache, "-C", "exp.yml")
        assert (rc, how) == (0, "composed"), out
        names.add(next(line for line in out.splitlines() if "name: exp-" in line))
    assert len(names) == 2 and not list((cache / "show").glob("*"))
    cfg.write_text(TINY)
    assert show(tmp_path, cache, "-C", "exp.yml")[::2] == (0, "composed")
    (entry,) = (cache / "show").glob("*.json")
    kept = json.loads(entry.read_text())
    for damage in ({"config": "garbage"}, {"yaml": "x"}):
        entry.write_text(json.dumps({**kept, **damage}))
        rc, out, how = show(tmp_path, cache, "-C", "exp.yml")
        assert (rc, how) == (0, "composed") and "Traceback" not in out, out
