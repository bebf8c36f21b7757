"""The description of the built-in components (catalogue.py): what listing, composing and
completing read of them is the same as from their modules, without importing torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env

from expctl import registry, signatures
from expctl.builtin import catalogue, description
from expctl.config import confstore
from expctl.config.schema import COMPONENT_KINDS

SECTION = {kind: section for section, kind in COMPONENT_KINDS.items()} | {"loggers": "logger"}


def _seen(entry: registry.Entry, kind: str) -> dict[str, object]:
    """Everything listing, composing and checking arguments read of an entry."""
    params = entry.parameters()
    seen: dict[str, object] = {
        "params": [
            (n, p.kind, repr(p.default), signatures.annotation_options(p), signatures.settable(p))
            for n, p in params.items()
        ],
        "listed": signatures.describe(entry),
        "defers": [n for n in params if entry.defers(n)],
        "any": entry.accepts_any(),
        "check": entry.check is not None,
        "own": (entry.name, entry.description, dict(entry.settings), entry.runtime),
        "more": (entry.inferred, entry.deferred),
    }
    if kind in SECTION:
        seen["node"] = confstore.node_defaults(SECTION[kind], entry)
    return seen


def test_described_entries_read_as_their_modules_register_them() -> None:
    builtins = registry.builtin_entries()
    assert {k for k, _, _ in builtins} == set(registry.KINDS) and len(builtins) > 150
    stored = json.loads(json.dumps([description.encode(*b) for b in builtins]))  # as on disk
    for (kind, entry, module), d in zip(builtins, stored, strict=True):
        k, described, m = description.decode(d)
        assert (k, m) == (kind, module) and module.startswith("expctl.")
        assert _seen(described, kind) == _seen(entry, kind), f"{kind} {entry.name}"


# `python -m expctl ARGV` in a fresh interpreter; prints what it imported of torch and Hydra
LOADED = """\
import runpy, sys
sys.argv = ["expctl", *sys.argv[1:]]
try:
    runpy.run_module("expctl", run_name="__main__")
except SystemExit as e:
    print("exit", e.code or 0)
print("imported:", sorted(m for m in ("torch", "hydra") if m in sys.modules))
"""


def _expctl(cache: Path, *args: str, path: str = "") -> tuple[str, int, list[str]]:
    """Output, exit code and what was imported of torch and Hydra (`path`: first on
    PYTHONPATH)."""
    env = cli_env(EXPCTL_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = f"{path}{os.pathsep}{env['PYTHONPATH']}" if path else env["PYTHONPATH"]
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, *args],
        env=env,
        cwd=cache.parent,  # not the checkout: `-c` puts the working directory first
        capture_output=True,
        text=True,
        timeout=600,
    )
    *out, code, imported = ["", "", *proc.stdout.splitlines()]
    assert code.startswith("exit ") and imported.startswith("imported: "), proc.stderr[-3000:]
    return "\n".join(out), int(code[5:]), json.loads(imported[10:].replace("'", '"'))


def _unshipped(tmp_path: Path) -> str:
    """A copy of the expctl package without its shipped description (as for torch versions it
    was not made for), for PYTHONPATH."""
    copy = tmp_path / "unshipped"
    shutil.copytree(
        Path(catalogue.__file__).parents[1],  # the package, of which catalogue is in builtin/
        copy / "expctl",
        ignore=shutil.ignore_patterns("__pycache__", catalogue.SHIPPED.name),
    )
    return str(copy)


def test_the_shipped_description_is_this_source_trees() -> None:
    shipped = json.loads(catalogue.SHIPPED.read_text())
    key = catalogue.shipped_key()
    versions = {k: v for k, v in key.items() if k != "sources"}
    if {k: shipped["made_from"][k] for k in versions} != versions:
        pytest.skip(f"made for {shipped['made_from']}, the versions CI pins; here {versions}")
    fresh = json.loads(json.dumps([description.encode(*b) for b in registry.builtin_entries()]))
    hint = "describe them again: python -m expctl.builtin.catalogue"
    assert shipped["entries"] == fresh, hint
    assert shipped["made_from"] == key, hint


@pytest.mark.slow
def test_first_use_after_install_reads_the_shipped_description(tmp_path: Path) -> None:
    """A fresh cache folder, or one that cannot be made: the first list, show, completion and
    help answer from the description shipped in the package, without torch."""
    if catalogue._shipped() is None:
        pytest.skip("the shipped description was made for other versions (see the test above)")
    for cache in (tmp_path / "cache", tmp_path / "not-a-folder"):
        if cache.name == "not-a-folder":
            cache.write_text("")
        words, code, imported = _expctl(cache, "_words")
        assert code == 0 and imported == [] and "model=resnet18" in words.splitlines()
        helped, code, imported = _expctl(cache, "run", "--help")
        assert code == 0 and imported == [] and "background" not in helped
        listed, code, imported = _expctl(cache, "list", "models")
        assert code == 0 and imported == [] and "resnet18" in listed
        shown, code, imported = _expctl(cache, "show", "model=resnet18")
        assert code == 0 and imported == ["hydra"] and "width_per_group: 64" in shown


# Datasets whose modules import torch (and built-in models, optimizers), with a value their
# pre-flight check refuses (None: none)
CHECKED_WITHOUT_TORCH = [
    ("data=synthetic", None),
    ("data=synthetic data.task=segmentation", "data.task: 'segmentation' is not one of"),
    ("data=synthetic data.shape=[0]", "data.shape=[0]"),
    ("data=arrays data.train=table.csv", None),
    ("data=arrays data.train=gone.npz", "gone.npz does not exist"),
    ("data=image_folder data.root=pics", None),
    ("data=image_folder data.root=gone", "does not exist"),
    ("data=image_folder data.root=pics data.preset=bogus", "data.preset: 'bogus' is not one"),
    ("data=image_folder data.root=pics data.val_split=1.5", "data.val_split=1.5: neither"),
    ("data=synthetic model.width=0", "model.width=0: a size of the model"),
    ("data=synthetic optim=adam optim.betas=[0.9]", "optim.betas=[0.9]: two numbers"),
    ("data=imagenet data.image_size=4", "data.image_size=4"),
    ("data=cifar10 data.download=true", None),
    ("data=cifar100", "data=cifar100: not found under {cwd}/data (data.root=null: the default"),
    ("data=svhn", "not found under {cwd}/data (data.root=null: the default, ./data) (expected"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "refused"), CHECKED_WITHOUT_TORCH)
def test_show_runs_the_pre_flight_checks_of_torch_datasets_without_torch(
    args: str, refused: str | None, tmp_path: Path
) -> None:
    """`show` checks data=synthetic, arrays, image_folder, ... (whose modules import torch) from
    their torch-free checks (datasets/preflight.py): the same verdict, and no torch."""
    if catalogue._shipped() is None:
        pytest.skip("the shipped description was made for other versions")
    (tmp_path / "table.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    (tmp_path / "pics" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "pics" / "val" / "cat").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, "show", *args.split()],
        env=cli_env(EXPCTL_CACHE_DIR=str(tmp_path / "cache")),
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    *shown, code, imported = proc.stdout.splitlines()
    assert "torch" not in imported, (args, imported)
    if refused is None:
        assert code == "exit 0" and "data:" in shown, proc.stderr
    else:
        assert code == "exit 2" and refused.replace("{cwd}", str(tmp_path)) in proc.stderr, (
            proc.stderr
        )
        assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_first_use_describes_in_the_background_then_nothing_loads_torch(tmp_path: Path) -> None:
    """Without a shipped description that fits, with a fresh cache folder: help and completion
    say what they know without torch and start the description; `list` waits for it; from then
    on list, show, help and completion import no torch and print what the modules themselves
    give (a cache folder that cannot be made)."""
    cache, none = tmp_path / "cache", tmp_path / "not-a-folder"
    none.write_text("")
    pkg = _unshipped(tmp_path)
    words, code, imported = _expctl(cache, "_words", path=pkg)
    assert code == 1 and imported == [], "not all words yet: the shell asks again"
    assert "launcher=local" in words and "model=resnet18" not in words
    helped, code, imported = _expctl(cache, "run", "--help", path=pkg)
    assert code == 0 and imported == [] and "described in the background" in helped
    for args in (["list"], ["show", "model=resnet18", "logger=[csv]"]):
        described, code, imported = _expctl(cache, *args, path=pkg)
        assert code == 0 and imported == (["hydra"] if args[0] == "show" else []), args
        real, code, imported = _expctl(none, *args, path=pkg)
        assert (code, described) == (0, real) and "torch" in imported, args
    words, code, imported = _expctl(cache, "_words", path=pkg)
    assert code == 0 and imported == []
    wanted = {"model=resnet18", "logger=csv", "train.step=gan", "logger.wandb.mode="}
    wanted |= {"train.precision=bf16", "train.compile=true"}  # a key's choices, booleans
    assert wanted <= set(words.splitlines())
    helped, _, imported = _expctl(cache, "run", "--help", path=pkg)
    assert imported == [] and "resnet18" in helped and "background" not in helped
    mine, code, imported = _expctl(cache, "list", "models", "--import", "faulty", path=pkg)
    assert code == 0 and "tiny_custom" in mine and "resnet18" in mine and "torch" in imported
    script, _, _ = _expctl(cache, "completion", "bash")
    (tmp_path / "expctl.bash").write_text(script)
    done = subprocess.run(
        ["bash", "-c", TAB, "bash", str(tmp_path / "expctl.bash")],
        env=cli_env(EXPCTL_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.splitlines()
    assert done == [
        "expctl list mo => models",
        "expctl list  => models datasets optimizers schedulers losses steps loggers",
        "expctl run logger=t => tensorboard",
        "expctl show model.wi => model.width= model.width_mult= model.width_per_group=",
        "asked once",
    ]


# bash completing command lines as the terminal would (the completion script is $1)
TAB = """
source "$1"
tab() {
  COMP_LINE=$1; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<<"$1"
  [[ $1 == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
  _expctl_complete; echo "$1 => ${COMPREPLY[*]}"
}
tab "expctl list mo"; tab "expctl list "; tab "expctl run logger=t"; tab "expctl show model.wi"
[[ -n $_EXPCTL_WORDS ]] && echo "asked once"
"""


def test_a_damaged_description_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "registry-x.json"
    kind, entry, module = registry.builtin_entries()[0]
    catalogue.write(path, [description.encode(kind, entry, module)])
    assert catalogue._read(path) is not None
    for damaged in (path.read_text()[:-9], path.read_text().replace(entry.name, "other")):
        path.write_text(damaged)
        assert catalogue._read(path) is None
