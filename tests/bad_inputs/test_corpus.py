"""The bad-input corpus: every case is a real CLI invocation that must end in one or two lines
(`expctl: error: ...` and a HINT), exit code 2, no traceback, and nothing left on disk (no run
directory, no job)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import conftest
import numpy as np
import pytest
import torch
from conftest import image_tree

from expctl import cli

TINY_IMAGES = ["data=image_folder", "data.image_size=8", "data.batch_size=4", "model=mlp"]

# a tiny real run: the mistakes found once it is built (a metric name, weights that do not fit)
SMALL_RUN = ["run", *conftest.SMALL, "train.device=cpu", "sched=none"]

CORPUS: list[tuple[list[str], str]] = [
    (["run", "-C", "missing.yml"], "no such file"),
    (["run", "-C", "notes.txt"], "must end in .yml or .yaml"),
    (["run", "-C", "broken.yml"], "not valid YAML"),
    (["run", "-C", "list.yml"], "must hold a mapping"),
    (["run", "-C", "unreadable.yml"], "cannot read it"),
    (["run", "-C", "typo_section.yml"], "Did you mean 'train'"),
    (["run", "-C", "typo_key.yml"], "Did you mean 'max_epochs'"),
    (["run", "-C", "bad_default.yml"], "Did you mean 'resnet18'"),
    (["run", "model=resnet19"], "Did you mean 'resnet18'"),
    (["run", "model.name=transformer9000"], "no 'transformer9000' in config group 'model'"),
    (["run", "data.name=fashion"], "Did you mean 'fashion_mnist'"),
    (["run", "optim.name=adamm"], "Did you mean 'adam'"),
    (["run", "sched=cosinee"], "Did you mean 'cosine'"),
    (["run", "loss.name=crossentropy"], "Did you mean 'cross_entropy'"),
    (["run", "train.step=supervise"], "Did you mean 'supervised'"),
    (["run", "optim.lrr=0.1"], "Did you mean 'lr'"),
    (["run", "train.max_epochs=0"], "below the minimum 1"),
    (["run", "train.max_epochs=-3"], "below the minimum 1"),
    (["run", "data.batch_size=0"], "below the minimum 1"),
    (["run", "train.max_epochs=ten"], "expected int"),
    (["run", "train.precision=fp8"], "not one of: auto, 32, bf16, 16"),
    (["run", "train.device=tpu"], "not one of: auto, cpu, cuda"),
    (["run", "optim.lr=fast"], "optim.lr: expected float"),
    (["run", "data.root=/nonexistent/fm"], "data=fashion_mnist: not found under /nonexistent/fm"),
    (["run", "data.root=corrupt_data"], "truncated or corrupt"),
    (["run", "imports=[no_such_module_xyz]"], "cannot import module"),
    (["run", "launcher.nproc=2"], "launcher=local"),
    (["run", "launcher=local", "launcher.nproc=0"], "below the minimum 1"),
    (["run", "launcher=nowhere"], "no 'nowhere' in config group 'launcher'"),
    (["run", "checkpoint.resume=/nope.pt"], "no checkpoint at"),
    (["run", "data=synthetic", "data.batch_size=100000"], "larger than the"),
    (["run", "optim.lr=[1,2"], "bad override"),
    (["run", "run.dir=a_file"], "exists and is not a directory"),
    # zero, negative and out-of-range sizes
    (["run", "train.grad_accum=0"], "below the minimum 1"),
    (["run", "train.log_every=0"], "below the minimum 1"),
    (["run", "train.gc_every=-1"], "below the minimum 0"),
    (["run", "train.gc_every=often"], "train.gc_every"),
    (["run", "train.val_every=-1"], "below the minimum 1"),
    (["run", "train.grad_clip=-1"], "below the minimum 0"),
    (["run", "checkpoint.keep=0"], "below the minimum 1"),
    (["run", "data.num_workers=-2"], "below the minimum 0"),
    (["run", "launcher=local", "launcher.max_restarts=-1"], "below the minimum 0"),
    (["run", "launcher.rdzv_timeout=0"], "below the minimum 1"),
    (["run", "data=synthetic", "data.num_classes=0"], "num_samples and num_classes must be >= 1"),
    (["run", "model=mlp", "+model.hidden=[-5]"], "rejected its arguments"),
    (["run", "train.channels_last=maybe"], "not one of: auto, true, false"),
    (["run", "sched=multistep", "sched.interval=hourly"], "not one of: epoch, step"),
    (["run", "train.on_nan=ignore"], "not one of: stop, skip"),
    (["run", "train.compile_mode=fast"], "not one of: default, reduce-overhead, max-autotune"),
    (["run", "train.compile_mode=reduce-overhead"], "does nothing without train.compile=true"),
    (["run", "data.augment=rotate"], "not one of: none, flip, crop_flip"),
    (
        ["run", "train.step=gan"],
        "trains models generator, discriminator",
    ),  # gan step needs the dcgan models: caught at build
    # hostile strings that would end up in paths, sbatch scripts or the environment
    (["run", "run.name=../../etc"], "run.name='../../etc'"),
    (["run", "run.name=a b"], "may only hold"),
    (["run", "run.name='x;rm -rf ~'"], "may only hold"),
    (["run", "run.name='$(id)'"], "may only hold"),
    (["run", "run.name='it\\'s'"], "may only hold"),
    (
        ["run", "launcher=slurm", "launcher.partition='debug; rm -rf ~'"],
        "sbatch values may only hold",
    ),
    (["run", "launcher=slurm", "launcher.job_name='$(reboot)'"], "sbatch values may only hold"),
    (["run", "launcher=slurm", "launcher.account='a`id`'"], "sbatch values may only hold"),
    (["run", "launcher=slurm", "launcher.qos='x\ny'"], "sbatch values may only hold"),
    (["run", "launcher=slurm", "launcher.constraint='a b'"], "sbatch values may only hold"),
    (
        ["run", "launcher=slurm", "+launcher.sbatch.signal=KILL"],
        "not an sbatch option expctl lets you set",
    ),
    (
        ["run", "launcher=slurm", "+launcher.sbatch.output=/etc/passwd"],
        "not an sbatch option expctl lets you set",
    ),
    (["run", "launcher=slurm", "+launcher.sbatch.comment='a;b'"], "sbatch values may only hold"),
    (["run", "+env.BAD-NAME=1"], "not an environment variable name"),
    (["run", "imports=['os;rm']"], "cannot import module"),
    (["run", "data.root='$(reboot)'"], "/$(reboot) (expected"),
    (["run", "-C", "../nope/../x.yml"], "no such file"),
    (["show", "-C", "broken.yml"], "not valid YAML"),
    (["sweep", "table", "."], "not a sweep directory"),
    (["status", "."], "not a run directory"),
    # issue 10: what looks valid but is not
    (["run", "hydra.run.dir=elsewhere"], "use run.dir=PATH"),
    (["run", "-m", "hydra.sweep.dir=elsewhere", "optim.lr=0.1,0.2"], "use run.root=PATH"),
    (["show", "hydra.job.chdir=true"], "hydra.* settings have no effect"),
    (["run", "-C", "hydra_section.yml"], "a hydra: section has no effect"),
    (["run", "data.val_batch_size=0"], "data.val_batch_size: 0 is below the minimum 1"),
    (["run", "data.device_resident=maybe"], "not one of: auto, true, false"),
    (["run", "optim.lr=nan"], "optim.lr=nan: not a finite number"),
    (["run", "launcher.rdzv_timeout=inf"], "not a finite number"),
    (["run", "launcher=slurm", "launcher.mem_gb=nan"], "not a finite number"),
    (["run", "model=cnn", "model.dropout=-inf"], "not a finite number"),
    (["run", "trian.max_epochs=1"], "Did you mean 'train.max_epochs'"),
    (["run", "precision=bf16"], "Did you mean 'train.precision'"),
    (["run", "model=resnet50", "model.width=3"], "not a key of model=resnet50"),
    # an argument no YAML value can give (it said "has no argument 'norm_layer'. Did you mean
    # 'norm_layer'?", listing it as valid)
    (["run", "model=resnet18", "model.norm_layer=x"], "takes a class, function or module"),
    (["run", "-C", "sgd_body.yml", "optim=adamm"], "Did you mean 'adam'"),
    (["run", "-C", "sgd_body.yml", "optim=adam", "optim.momentum=0.9"], "not a key of optim=adam"),
    (["run", "-C", "two_names.yml"], "optim is both 'adam' and 'sgd'"),
    (["run", "launcher.sbatch.exclusive=true"], "launcher=slurm has it"),
    (["run", "launcher=slurm", "launcher.sbatch.signal=KILL"], "not an sbatch option"),
    (["run", "env.BAD-NAME=1"], "not an environment variable name"),
    (["run", "sched=multisteplr"], "needs argument 'milestones'"),
    (["run", "~model"], "deleting is not supported"),
    (["run", "experiment=nope"], "no 'nope' in config group 'experiment'"),
    (["show", "env.T=${oc.env:EXPCTL_UNSET_VARIABLE}"], "EXPCTL_UNSET_VARIABLE"),
    (["show", "train.max_epochs=${oc.env:EXPCTL_TEST_SECRET}"], "converted to Integer"),
    (["run", "-C", "secret_name.yml"], "may only hold"),
    (
        ["run", "data=synthetic", "model=mlp", "model.hidden=[${oc.env:EXPCTL_TEST_SECRET}]"],
        "rejected its arguments",
    ),
    (
        [
            "run",
            "data=synthetic",
            "data.num_samples=64",
            "data.batch_size=32",
            "train.grad_accum=3",
        ],
        "needs 3 batches per epoch",
    ),
    (["run", "optim=sparseadam"], "sparse gradients only"),
    # issue 12: control characters in what becomes a file name, an environment variable or an
    # sbatch line (NUL from a file: a command line cannot hold one)
    (["run", "-C", "nul_dir.yml"], "run.dir='runs\\x00x'"),
    (["run", "-C", "nul_env.yml"], "env.TOKEN='a\\x00b'"),
    (["show", "-C", "env_key_newline.yml"], "'A\\n': not an environment variable name"),
    (["show", "launcher=slurm", "run.root='a\nb'"], "run.root='a\\nb': control characters"),
    (["show", "launcher=slurm", "run.dir='a\nb'"], "run.dir='a\\nb': control characters"),
    (["show", "launcher=slurm", "run.name='ab\n'"], "run.name='ab\\n'"),
    (["show", "launcher=slurm", "launcher.job_name='ab\n'"], "launcher.job_name='ab\\n'"),
    (["show", "launcher=slurm", "launcher.qos='x\n'"], "sbatch values may only hold"),
    (["show", "launcher=slurm", "launcher.setup=['a\nb']"], "launcher.setup[0]='a\\nb'"),
    (["show", "-C", "sbatch_key_newline.yml"], "'launcher.sbatch.mail\\ntype': not an sbatch"),
    (["show", "-C", "sbatch_value.yml"], "launcher.sbatch.comment='a;b'"),
    # issue 12: YAML and data files beyond their bounds
    (["show", "-C", "alias_bomb.yml"], "more than 10000 values once its aliases"),
    (["show", "-C", "huge.yml"], "larger than 1 MiB"),
    (["run", "data.root=small_images"], "its header declares 5 x 5 x 5, expected N x 28 x 28"),
    # issue 12: imports are module names, never paths
    (["show", "-C", "import_path.yml"], "cannot import module '../x': not a dotted module name"),
    (["show", "-C", "import_hidden.yml"], "'.hidden': not a dotted module name"),
    (["show", "-C", "import_empty.yml"], "'': not a dotted module name"),
    (["show", "-C", "import_space.yml"], "'a b': not a dotted module name"),
    # issue 12: a plugin module that is itself broken
    (["run", "imports=[corpus_syntax_error]"], "failed to import at "),
    (["run", "imports=[corpus_raises]"], "RuntimeError: no GPU license found"),
    (["run", "imports=[corpus_exits]"], "failed to import at "),
    # issue 11: real data, your own files
    (["run", "data=image_folder", "data.root=nowhere"], "/nowhere does not exist"),
    (["run", "data=image_folder", "data.root=empty_images"], "holds no class folders"),
    (["run", "data=image_folder", "data.root=no_images", "data.val_split=1"], "folder(s) dog in"),
    (["run", "data=image_folder", "data.root=images", "data.val=valid"], "data.val: no folder"),
    (["run", "data=image_folder", "data.root=images", "data.train=trian"], "data.train: no folder"),
    (["run", "data=image_folder", "data.root=images/train"], "what validates?"),
    (["run", *TINY_IMAGES, "data.root=corrupt_images"], "cannot be decoded"),
    (["run", *TINY_IMAGES, "data.root=images", "data.preset=rotate"], "not one of: imagenet"),
    (["run", *TINY_IMAGES, "data.root=images", "data.decode=gpu"], "needs a CUDA device"),
    (["run", "data=cifar10", "data.root=nowhere"], "cifar-10-batches-py/data_batch_1"),
    (["run", "data=cifar10", "data.root=hostile_cifar"], "which a CIFAR file never does"),
    (["run", "data=mnist", "data.root=nowhere"], "data=mnist: not found under /"),
    (["run", "data=emnist", "data.root=nowhere"], "data=emnist: not found under /"),
    (["run", "data=flowers102", "data.root=nowhere"], "flowers-102/ with jpg/"),
    (["run", "data=eurosat", "data.root=nowhere"], "eurosat/2750/"),
    (["run", "data=fashion_mnist", "data.val_split=70000"], "does not split 60000"),
    (["run", "data=arrays"], "needs argument 'train'"),
    (["run", "data=arrays", "data.train=missing.csv"], "missing.csv does not exist"),
    (["run", "data=arrays", "data.train=notes.txt"], "is not a .csv, .npy or .npz file"),
    (["run", "data=arrays", "data.train=table.csv", "data.target=nope"], "no column 'nope'"),
    (["run", "data=arrays", "data.train=table.csv", "data.task=ranking"], "not one of"),
    (["run", "imports=[corpus_bad_dataset]", "data=pair"], "returned tuple, not expctl.Splits"),
    # issue 16: reading a sweep (`swept`: a sweep whose 2 trials have not started)
    (["sweep", "table", "swept", "--filter", "status=complete"], "Did you mean 'completed'?"),
    (["sweep", "table", "swept", "--filter", "stauts=failed"], "Did you mean 'status'?"),
    (["sweep", "table", "swept", "--filter", "status"], "expected KEY=VALUE"),
    (["sweep", "table", "swept", "--sort=-optm.lr"], "--sort optm.lr: no such column"),
    (["sweep", "table", "--csv", "swept", "--sort", "wall"], "Did you mean 'wall_s'?"),
    (["sweep", "best", "swept", "--json"], "applies to `expctl sweep table` only"),
    (["sweep", "best", "swept"], "no completed trial yet"),
    (["sweep", "table", "--json", "."], "not a sweep directory"),
    (["sweep", "plot", "."], "not a sweep directory"),
    # issue 16: a run's `imports:` module deleted from where the run found it
    (
        ["run", "-C", "gone_run/config.yaml"],
        "imported it from /moved/gone_module_xyz.py, which is gone",
    ),
    # issue 13: best checkpoints, early stopping, metric schedulers, weights-only starts, eval
    (["run", "checkpoint.mode=up"], "checkpoint.mode: 'up' is not one of: min, max"),
    (["run", "train.early_stop.mode=lower"], "train.early_stop.mode: 'lower' is not one of"),
    (["run", "train.early_stop.patience=0"], "below the minimum 1"),
    (["run", "train.early_stop.patiense=2"], "Did you mean 'early_stop.patience'"),
    (["run", "train.val_every_steps=0"], "below the minimum 1"),
    (["run", "checkpoint.monitor=loss"], "only validation metrics (val/...) can be monitored"),
    ([*SMALL_RUN, "checkpoint.monitor=val/accuracy"], "Did you mean 'val/acc'"),
    ([*SMALL_RUN, "train.early_stop.monitor=val/los"], "Did you mean 'val/loss'"),
    ([*SMALL_RUN, "data.val_samples=0", "checkpoint.monitor=val/acc"], "reports no metrics"),
    (["run", "sched=cosine", "sched.monitor=val/loss"], "steps on no metric"),
    (["run", "sched=reducelronplateau", "sched.monitor=null"], "steps on a metric and needs one"),
    (["run", "checkpoint.init=/nope.pt"], "checkpoint.init: nothing at '/nope.pt'"),
    ([*SMALL_RUN, "checkpoint.init=wrong_keys.pt"], "do not fit: model 'model' missing 4"),
    ([*SMALL_RUN, "checkpoint.init=notes.txt"], "cannot read"),
    (["run", "checkpoint.init=notes.txt", "checkpoint.resume=notes.txt"], "pick one"),
    (["eval", "."], "not a run directory"),
    (["eval", "nowhere"], "not a run directory"),
    # issue 13: runs side by side (`gone_run`: a run directory that never trained)
    (["runs"], "runs: no such folder"),
    (["runs", "images"], "no run directory (a folder with config.yaml) under images"),
    (["runs", "gone_run", "--sort", "stauts"], "Did you mean 'status'?"),
    (["runs", "gone_run", "--csv", "--filter", "status=complete"], "Did you mean 'completed'?"),
    (["runs", "gone_run", "--filter", "imprts=x"], "--filter imprts: no such column"),
    (["runs", "gone_run", "--filter", "imports>many"], "> compares numbers"),
    (["runs", "gone_run", "--filter", "imports"], "expected KEY=VALUE"),
    (["diff", "gone_run", "."], ".: not a run directory"),
    (["diff", "nowhere", "gone_run"], "nowhere: not a run directory"),
    # from a user trial: interval bounds, checked before the sweep directory exists
    (["run", "-m", "sweep=random", "optim.lr=interval(0.1, 0.01)"], "needs low < high"),
    (["run", "-m", "sweep=tpe", "optim.lr=tag(log, interval(-1, 0.1))"], "a log interval needs"),
    # issue 13: loggers
    (["run", "logger=[mlflow]", "logger.mlflow.tracking_uri=foo://bar"], "has no scheme MLflow"),
    (["run", "logger=[csv,tensorbord]"], "unknown logger name 'tensorbord'. Did you mean"),
    (["run", "logger=[csv]", "logger.mlflow.experiment=x"], "pick it too: logger=[csv,mlflow]"),
    (["run", "logger=[mlflow]", "logger.mlflow.experimnt=x"], "Did you mean 'experiment'?"),
    (["run", "logger=[wandb]", "logger.wandb.mode=online2"], "not one of: offline, online"),
    (["run", "-C", "logger_number.yml"], "logger must list logger names, got 5"),
    # issue 13: the code snapshot of a Slurm job
    (["run", "launcher=slurm", "launcher.snapshot=gti"], "Did you mean 'git'"),
    (
        [*SMALL_RUN, "launcher=slurm", "imports=[corpus_pkg]", "launcher.snapshot_max_mb=0.001"],
        "over launcher.snapshot_max_mb=0.001",
    ),
    ([*SMALL_RUN, "launcher=slurm", "launcher.snapshot=git"], "is in no git repository"),
    # issue 24: Hydra's grammar (tests/test_space.py compares with Hydra's own sweeper)
    (["show", "=1"], "override '=1' has no key"),
    (["show", "=1.5"], "has no key"),
    (["show", "=true"], "has no key"),
    (["show", "=null"], "has no key"),
    (["run", "-m", "=1,2"], "has no key"),
    (["run", "-m", "optim.lr=range(1,5,0)"], "range() needs a step other than 0"),
    (["run", "-m", "optim.lr=range(0,1,0.0)"], "range() needs a step other than 0"),
    (["run", "-m", "optim.lr=range(3,1)"], "optim.lr: the sweep gives it no value"),
    (["run", "-m", "optim.lr=range(0,inf,0.1)"], "range() needs finite numbers"),
    (["run", "-m", "model=glob(zz*)"], "model: the sweep gives it no value"),
    (["run", "-m", "optim.lr=glob(*)"], "'optim.lr' is not one"),
    (["run", "-C", "self_twice.yml"], "defaults lists _self_ twice"),
]


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("model: cnn\n")
    (tmp_path / "broken.yml").write_text("model: {name: cnn\ntrain: [\n")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    unreadable = tmp_path / "unreadable.yml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "typo_section.yml").write_text("trian:\n  max_epochs: 2\n")
    (tmp_path / "typo_key.yml").write_text("train:\n  max_epoch: 2\n")
    (tmp_path / "bad_default.yml").write_text("defaults:\n  - model: resnet19\n")
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "hydra_section.yml").write_text("hydra:\n  run:\n    dir: elsewhere\n")
    (tmp_path / "sgd_body.yml").write_text("optim: {name: sgd, lr: 0.1, momentum: 0.9}\n")
    (tmp_path / "two_names.yml").write_text("defaults: [{optim: adam}]\noptim: {name: sgd}\n")
    (tmp_path / "logger_number.yml").write_text("logger: 5\n")
    (tmp_path / "self_twice.yml").write_text("defaults: [_self_, {optim: adam}, _self_]\n")
    (tmp_path / "secret_name.yml").write_text("run: {name: '${oc.env:EXPCTL_TEST_SECRET}'}\n")
    _fashion_files(tmp_path / "corrupt_data", (5, 28, 28), 10)  # 10 bytes of 5 images
    _fashion_files(tmp_path / "small_images", (5, 5, 5), 125)  # 5 x 5 pixels: not Fashion-MNIST
    (tmp_path / "nul_dir.yml").write_text('run: {dir: "runs\\0x"}\n')
    (tmp_path / "nul_env.yml").write_text('env: {TOKEN: "a\\0b"}\n')
    (tmp_path / "env_key_newline.yml").write_text('env: {"A\\n": "1"}\n')
    (tmp_path / "sbatch_key_newline.yml").write_text(
        'launcher: {name: slurm, sbatch: {"mail\\ntype": END}}\n'
    )
    (tmp_path / "sbatch_value.yml").write_text(
        "launcher: {name: slurm, sbatch: {comment: 'a;b'}}\n"
    )
    (tmp_path / "alias_bomb.yml").write_text(ALIAS_BOMB)
    (tmp_path / "huge.yml").write_text("# padding\n" * 120_000)
    for name, module in [("path", "../x"), ("hidden", ".hidden"), ("empty", ""), ("space", "a b")]:
        (tmp_path / f"import_{name}.yml").write_text(f"imports: ['{module}']\n")
    (tmp_path / "corpus_syntax_error.py").write_text("def broken(:\n    pass\n")
    (tmp_path / "corpus_raises.py").write_text("raise RuntimeError('no GPU license found')\n")
    (tmp_path / "corpus_exits.py").write_text("raise SystemExit(0)\n")
    _image_inputs(tmp_path)
    _hostile_cifar(tmp_path / "hostile_cifar" / "cifar-10-batches-py")
    _sweep_not_started(tmp_path / "swept")
    (tmp_path / "gone_run").mkdir()
    (tmp_path / "gone_run" / "config.yaml").write_text("imports: [gone_module_xyz]\n")
    where = {"file": "/moved/gone_module_xyz.py", "path": "/moved"}
    (tmp_path / "gone_run" / "imports.json").write_text(json.dumps({"gone_module_xyz": where}))
    torch.save({"a.weight": torch.zeros(2)}, tmp_path / "wrong_keys.pt")
    (tmp_path / "corpus_pkg").mkdir()
    (tmp_path / "corpus_pkg" / "__init__.py").write_text("# padding\n" * 200)  # 2 kB
    return tmp_path


def _image_inputs(tmp_path: Path) -> None:
    """Image folders (good, empty, with an empty class, all corrupt), a table and a dataset
    plugin that breaks the contract."""
    image_tree(tmp_path / "images" / "train", classes=2, per_class=4)
    image_tree(tmp_path / "images" / "val", classes=2, per_class=2)
    (tmp_path / "empty_images").mkdir()
    image_tree(tmp_path / "no_images" / "cat", classes=1, per_class=2)
    (tmp_path / "no_images" / "dog").mkdir()
    (tmp_path / "no_images" / "dog" / "notes.txt").write_text("no image here")
    for split in ("train", "val"):
        bad = image_tree(tmp_path / "corrupt_images" / split, classes=2, per_class=2)
        for p in bad.rglob("*.*"):
            p.write_bytes(p.read_bytes()[:40])
    (tmp_path / "table.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    (tmp_path / "corpus_bad_dataset.py").write_text(
        "import expctl, torch\n"
        "@expctl.register('datasets')\n"
        "def pair():\n"
        "    ds = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4).long())\n"
        "    return ds, ds\n"
    )


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch code_ran",))  # in the corpus directory: "nothing on disk"


def _hostile_cifar(folder: Path) -> None:
    """CIFAR-10's six batches, the first one calling os.system as it unpickles."""
    folder.mkdir(parents=True)
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "data_batch_1").write_bytes(pickle.dumps({**batch, "x": _RunsCode()}))


def _sweep_not_started(path: Path) -> None:
    """A grid sweep over optim.lr=0.1,0.2 whose driver stopped before its first trial."""
    from expctl.config import SweepConfig
    from expctl.layout import SweepDir
    from expctl.study import open_study

    path.mkdir()
    points = [{"optim.lr": "0.1"}, {"optim.lr": "0.2"}]
    spec = {"config_file": None, "plain": [], "points": points, "repeat": 1, "n_trials": 2}
    spec["dims"] = [{"key": "optim.lr", "values": ["0.1", "0.2"]}]
    SweepDir(path).spec.write_text(json.dumps(spec))
    open_study(path, SweepConfig(), create=True)


# the "billion laughs": 9**9 strings from 400 bytes, once its aliases are expanded
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def _fashion_files(folder: Path, images: tuple[int, int, int], image_bytes: int) -> None:
    """The four Fashion-MNIST files, with `images` in their headers (labels: as many)."""
    folder.mkdir()
    header = b"\x00\x00\x08\x03" + b"".join(d.to_bytes(4, "big") for d in images)
    labels = b"\x00\x00\x08\x01" + images[0].to_bytes(4, "big") + b"\x00" * images[0]
    for split in ("train", "t10k"):
        (folder / f"{split}-images-idx3-ubyte").write_bytes(header + b"\x00" * image_bytes)
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(labels)


@pytest.mark.parametrize(("args", "expected"), CORPUS, ids=[" ".join(a)[:60] for a, _ in CORPUS])
def test_bad_input_is_a_short_error_with_exit_2_and_nothing_on_disk(
    args: list[str],
    expected: str,
    corpus_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _refused(args, expected, corpus_dir, capsys, monkeypatch)


@pytest.mark.parametrize("logger", ["mlflow", "wandb", "tensorboard"])
def test_a_logger_whose_package_is_missing_names_the_extra_before_any_run_dir(
    logger: str,
    corpus_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, logger, None)  # find_spec: not installed
    expected = f"logger {logger} needs the '{logger}' package"
    args = [*SMALL_RUN, f"logger=[csv,{logger}]"]
    err = _refused(args, expected, corpus_dir, capsys, monkeypatch)
    assert f"HINT: pip install 'expctl[{logger}]'" in err


def _refused(
    args: list[str],
    expected: str,
    corpus_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """`expctl ARGS` exits 2 with one or two lines holding `expected`, and leaves nothing;
    returns what it printed on stderr."""
    monkeypatch.chdir(corpus_dir)
    monkeypatch.setenv("EXPCTL_TEST_SECRET", "hunter2 is my password")
    before = sorted(p.name for p in corpus_dir.iterdir())
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "", "nothing is printed before the error (`expctl show` included)"
    assert expected in err, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("expctl: error: "), err
    assert len(lines) == 1 or lines[1].startswith("  HINT: "), err
    assert "Traceback" not in err
    assert "hunter2" not in err, "a value from the environment is never printed"
    assert sorted(p.name for p in corpus_dir.iterdir()) == before, "nothing half-written on disk"
    return err


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 40


@pytest.mark.xdist_group("slurm")  # reads the queue: not while other tests submit jobs
def test_hostile_values_never_reach_sbatch(corpus_dir: Path) -> None:
    """A hostile partition is refused before any job exists (when a cluster is here to receive one)."""
    import shutil

    if shutil.which("squeue") is None:
        pytest.skip("no Slurm client")
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    proc = subprocess.run(
        [sys.executable, "-m", "expctl", "run", "launcher=slurm", "launcher.partition=a;b"],
        cwd=corpus_dir,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
        == before
    )
