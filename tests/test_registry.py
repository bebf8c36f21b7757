"""Registries: built-in names, did-you-mean errors, argument checks against signatures."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import compose_resnet

from expctl import importpath, registry, signatures
from expctl.errors import UserError


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        (
            "models",
            ["linear", "mlp", "cnn", "dcgan", "gpt", "resnet18", "vit_b_16", "mobilenet_v3_small"],
        ),
        ("datasets", ["fashion_mnist", "synthetic", "tokens"]),
        ("optimizers", ["sgd", "adam", "adamw", "rmsprop"]),
        ("schedulers", ["warmup_cosine", "cosine", "multistep", "multisteplr", "onecycle", "step"]),
        ("losses", ["cross_entropy", "mse", "bce_with_logits", "nll", "smooth_l1"]),
        ("steps", ["supervised", "gan", "lm"]),
    ],
)
def test_builtins_are_registered(kind: str, names: list[str]) -> None:
    assert set(names) <= set(registry.names(kind))


def test_unknown_name_lists_choices_and_suggests() -> None:
    with pytest.raises(UserError) as e:
        registry.get("models", "resnet19")
    msg = str(e.value)
    assert "resnet19" in msg and "Did you mean 'resnet18'" in msg and "expctl list models" in msg


def test_unknown_argument_suggests_the_closest() -> None:
    with pytest.raises(UserError) as e:
        signatures.check_args("optimizers", "sgd", {"lr": 0.1, "momentun": 0.9}, "optim")
    assert "optim.momentun" in e.value.message and "Did you mean 'momentum'" in e.value.message


def test_wrong_type_is_named() -> None:
    with pytest.raises(UserError, match=r"optim.lr: expected float"):
        signatures.check_args("optimizers", "sgd", {"lr": "fast"}, "optim")


def test_missing_required_argument() -> None:
    with pytest.raises(UserError, match="needs argument 'milestones'"):
        signatures.check_args("schedulers", "multistep", {}, "sched")


def test_torchvision_model_arguments_are_checked_against_the_class() -> None:
    signatures.check_args(
        "models", "resnet18", {"num_classes": 10, "zero_init_residual": True}, "model"
    )
    with pytest.raises(UserError, match="Did you mean 'zero_init_residual'"):
        signatures.check_args("models", "resnet18", {"zero_init_residul": True}, "model")


def test_user_registration_and_import_errors() -> None:
    registry.import_user_modules(["faulty"])  # tests/plugins, put on sys.path by conftest
    assert "tiny_custom" in registry.names("models")
    with pytest.raises(UserError, match="cannot import module 'no_such_module_xyz'"):
        registry.import_user_modules(["no_such_module_xyz"])


@pytest.mark.parametrize("module", ["../x", ".hidden", "", "a b", "pkg.", "os;rm", "my/mod.py"])
def test_imports_are_dotted_module_names_only(module: str) -> None:
    with pytest.raises(UserError, match=f"cannot import module {re.escape(repr(module))}: not a"):
        registry.import_user_modules([module])


def test_imports_are_searched_after_site_packages_and_nothing_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`imports:` modules are found in the working directory and the -C file's folders, which
    go after site-packages (a torchvision.py there never shadows torchvision). Without
    `imports:` the module search path is not touched: a dill.py there would stand in for an
    optional package that is not installed. A caller's first entry stays first (load_model)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])  # `python -c`, a notebook
    monkeypatch.setenv(importpath.IMPORT_PATH, os.pathsep.join(["/cfg/a", "/cfg/b"]))
    before = list(sys.path)
    registry.import_user_modules([])
    assert sys.path == before
    (tmp_path / "here_mod.py").write_text("")
    registry.import_user_modules(["here_mod"])
    site = max(i for i, p in enumerate(sys.path) if p.endswith("site-packages"))
    assert sys.path[: len(before)] == before, "entries are added at the end only"
    assert min(sys.path.index(p) for p in (str(tmp_path), "/cfg/a", "/cfg/b")) > site
    del sys.modules["here_mod"]


def test_the_config_files_folder_reaches_workers_outside_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from expctl.config import compose

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(importpath.IMPORT_PATH, "")
    monkeypatch.setenv("PYTHONPATH", "/unchanged")
    (tmp_path / "my.yml").write_text("train: {max_epochs: 1}\n")
    before = list(sys.path)
    compose.compose(str(tmp_path / "my.yml"), check_components=False)
    assert os.environ[importpath.IMPORT_PATH] == str(tmp_path)
    assert os.environ["PYTHONPATH"] == "/unchanged", "PYTHONPATH comes before site-packages"
    assert sys.path == before, "searched only for `imports:` modules"


def test_builtin_factories_build() -> None:
    import torch

    m = registry.get("models", "resnet18").factory(in_channels=1, num_classes=10)
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    pair = registry.get("models", "dcgan").factory(input_shape=(1, 28, 28))
    fake = pair["generator"](torch.zeros(2, 100))
    assert fake.shape == (2, 1, 28, 28) and pair["discriminator"](fake).shape == (2, 1)


def _torchvision_names() -> list[str]:
    return [n for n in registry.names("models") if registry.get("models", n).params_of is not None]


@pytest.mark.parametrize("name", _torchvision_names())
def test_every_torchvision_model_builds_from_its_config_node(name: str) -> None:
    """The node's values (class defaults shown, builder-set arguments null) build the model:
    no argument the builder also sets is passed twice. Built on the meta device: no memory."""
    import torch

    from expctl.config import confstore
    from expctl.config import schema as config

    entry = registry.get("models", name)
    own = config.framework_keys("model")
    args = {k: v for k, v in confstore.node_defaults("model", entry).items() if k not in own}
    args.update(in_channels=1, num_classes=3)
    try:
        with torch.device("meta"):
            model = entry.factory(**args)
    except NotImplementedError as e:  # RegNet reads a tensor's value while building
        assert "meta" in str(e)
        pytest.skip(f"{name} cannot be built on the meta device")
    assert sum(p.numel() for p in model.parameters()) > 0


def _facts(entry: registry.Entry) -> object:
    """Everything composing, checking and listing read from a model's entry."""
    from expctl.config import confstore

    params = entry.parameters().values()
    return (
        [
            (p.name, p.kind, p.default, type(p.default), signatures._annotation_name(p))
            for p in params
        ],
        signatures.describe(entry),
        entry.accepts_any(),
        [entry.defers(p.name) for p in params],
        confstore.node_defaults("model", entry),
    )


def test_the_torchvision_signature_cache_describes_each_model_as_torchvision_does() -> None:
    """Each classifier's entry rebuilt from the cache's JSON equals the one made from
    torchvision's class: parameters (kind, default and its type, annotation), what `expctl
    list` prints, which null arguments the builder sets, the config node."""
    from expctl.builtin import tvmodels

    specs = json.loads(json.dumps(tvmodels._torchvision_specs()))
    assert "resnet18" in specs["models"] and "vit_b_16" in specs["imported"]
    inferred = frozenset(("in_channels", "num_classes"))
    for name, cls, builder in tvmodels._torchvision_classes():
        if name not in specs["models"]:
            continue
        real_sets = tvmodels._builder_sets(builder, cls) if isinstance(cls, type) else None
        factory = tvmodels._torchvision_factory(name)
        real = registry.Entry(
            name, factory, inferred=inferred, params_of=cls if isinstance(cls, type) else None,
            deferred=None if real_sets is None else frozenset(real_sets),
        )  # fmt: skip
        spec = specs["models"][name]
        cached = registry.Entry(
            name, factory, inferred=inferred, params_of=tvmodels._stub(name, spec["params"]),
            deferred=None if spec["deferred"] is None else frozenset(spec["deferred"]),
        )  # fmt: skip
        assert _facts(cached) == _facts(real), name


@pytest.mark.slow
def test_composing_a_torchvision_model_imports_torchvision_once_per_version(
    tmp_path: Path,
) -> None:
    """The first composition writes the signature cache; the next checks the same arguments,
    with the same errors, without importing torchvision (a damaged cache:
    bad_inputs/test_damaged_files.py)."""
    first, second = compose_resnet(tmp_path), compose_resnet(tmp_path)
    assert first[1] == "True" and second[1] == "False"
    assert first[0] == second[0] and "'width_per_group': 64" in first[0]
    assert first[2] == second[2] and "Did you mean 'width_per_group'" in first[2]


def test_the_signature_cache_keeps_the_newest_eight_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Environments sharing a cache folder (other torchvision versions) keep theirs: writing a
    new version removes only what is older than the newest seven others."""
    from expctl.builtin import tvmodels

    for i in range(10):
        old = tmp_path / f"torchvision-old{i}.json"
        old.write_text("{}")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    monkeypatch.setenv("EXPCTL_CACHE_DIR", str(tmp_path))
    tvmodels._register_torchvision()
    left = sorted(p.name for p in tmp_path.glob("torchvision-*.json"))
    mine = tvmodels._signature_cache()
    assert mine is not None and mine.name in left and len(left) == 8
    assert [n for n in left if n != mine.name] == [f"torchvision-old{i}.json" for i in range(3, 10)]
