"""The bad-input corpus: every case is a real CLI invocation that must end in one or two lines
(`expctl: error: ...` and a HINT), exit code 2, no traceback, and nothing left on disk (no run
directory, no job)."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import stat
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
SYNTHETIC = ["run", "data=synthetic", "data.shape=[6]", "train.device=cpu", "sched=none"]
ARRAYS = ["run", "data=arrays", "model=mlp", "train.device=cpu", "data.batch_size=4"]
# a language model on token files (issue 27); each case names what differs first (its id)
TOKENS = ["data=tokens", "model=gpt", "train.step=lm", "train.device=cpu", "data.block_size=16"]
# data.root=null: ./data, named by its absolute path (the working folder's)
NULL_ROOT = "/data (data.root=null: the default, ./data) (expected"

CORPUS: list[tuple[list[str], str]] = [
    (["run", "-C", "missing.yml"], "no such file"),
    (["run", "-C", "notes.txt"], "must end in .yml or .yaml"),
    (["run", "-C", "broken.yml"], "not valid YAML"),
    (["run", "-C", "list.yml"], "must hold a mapping"),
    (["run", "-C", "unreadable.yml"], "not a text file (byte 0 is not UTF-8"),
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
    # a float of 1 or more in a config file too (a frozen run of 0.1's is read as its count)
    (["run", "-C", "val_split_one.yml"], "data.val_split=1.0: neither a count"),
    # refused once the run directory exists: a folder that was there before stays, even empty
    # (it was removed, the shell's working directory too: a new user's trial)
    (["run", "data=synthetic", "data.batch_size=100000", "run.dir=empty"], "larger than the"),
    (["run", "data=synthetic", "data.batch_size=99999", "run.dir=empty/a/b"], "larger than the"),
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
    (["run", "data.timeout=0"], "below the minimum 1"),
    (["run", "launcher=local", "launcher.max_restarts=-1"], "below the minimum 0"),
    (["run", "launcher.rdzv_timeout=0"], "below the minimum 1"),
    (["run", "data=synthetic", "data.num_classes=0"], "num_samples and num_classes must be >= 1"),
    (["run", "model=mlp", "+model.hidden=[-5]"], "model.hidden[0]=-5: a size of the model"),
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
    (["run", "data=image_folder", "data.root=images", "data.test=tst"], "data.test: no folder"),
    (
        ["run", "data=image_folder", "data.root=images/train", "data.val_split=1", "data.test=tst"],
        "data.test=tst: ",
    ),
    (["run", "data=image_folder", "data.root=images/train"], "what validates?"),
    # a new user's trial: data.root=null names the folder it looked at, and that null led there
    (
        ["run", "data=image_folder", "data.root=null"],
        "/data (data.root=null: the default, ./data) does not exist",
    ),
    # a class folder that is a broken link would be left out, and the labels of the rest change
    (
        ["run", *TINY_IMAGES, "data.root=broken_class", "data.val=null"],
        "broken_class/class_2 is a broken symbolic link (to ",
    ),
    (  # a class folder linked to the folder of classes: every image in it, as well
        ["run", *TINY_IMAGES, "data.root=looped_class", "data.val=null"],
        "looped_class/loop leads to",
    ),
    (  # a folder linked inside a class, into another class: its images in two classes
        ["run", *TINY_IMAGES, "data.root=crossed_class", "data.val=null"],
        "(in class folder class_1) leads to",
    ),
    (["run", *TINY_IMAGES, "data.root=broken_split"], "broken_split/val is a broken symbolic"),
    # an image that is a broken link was left out silently (data.on_corrupt=skip: a warning)
    (
        ["run", *TINY_IMAGES, "data.root=broken_image", "data.val=null"],
        "broken_image/class_1/img_001.jpg is a broken symbolic link (to ",
    ),
    # a float is a fraction, never a count: 1.0 held out one sample
    (
        ["run", *TINY_IMAGES, "data.root=images", "data.val_split=1.0"],
        "data.val_split=1.0: neither a count of samples (an integer >= 1) nor a fraction",
    ),
    (["run", *TINY_IMAGES, "data.root=images", "data.val_split=2.0"], "data.val_split=2;"),
    (["run", "data=fashion_mnist", "data.val_split=5000.0"], "data.val_split=5000.0: neither"),
    # one number where one per channel is expected: the hint gives the form, not [0.5]
    (
        ["run", *TINY_IMAGES, "data.root=images", "data.mean=0.5"],
        "data.mean=0.5: a list of one value per channel, 3 of them (data.channels=3)\n"
        "  HINT: e.g. data.mean=[0.485,0.456,0.406] data.std=[0.229,0.224,0.225]",
    ),
    (
        ["run", *TINY_IMAGES, "data.root=images", "data.mean=[0.5]", "data.std=[0.2]"],
        "give both, 3 value(s) each, one per channel",
    ),
    (["run", *TINY_IMAGES, "data.root=corrupt_images"], "cannot be decoded"),
    (
        ["run", *TINY_IMAGES, "data.root=empty_val"],
        "or validate on part of train (data.val_split=0.1), or not at all (data.val=null)",
    ),
    (["run", *TINY_IMAGES, "data.root=images", "data.preset=rotate"], "not one of: imagenet"),
    (["run", *TINY_IMAGES, "data.root=images", "data.decode=gpu"], "needs a CUDA device"),
    (
        ["run", *TINY_IMAGES, "data.root=images", "data.decode=nvimgcodec"],
        "nvidia-nvimgcodec is not",
    ),
    (["run", "data=cifar10", "data.root=nowhere"], "cifar-10-batches-py/data_batch_1"),
    (["run", "data=cifar10", "data.root=hostile_cifar"], "which a CIFAR file never does"),
    (["run", "data=mnist", "data.root=nowhere"], "data=mnist: not found under /"),
    (["run", "data=emnist", "data.root=nowhere"], "data=emnist: not found under /"),
    # data.root=null: the absolute ./data looked at, as the image datasets name it
    (["run", "data=mnist"], NULL_ROOT + " train-images-idx3-ubyte"),
    (["run", "data=emnist"], NULL_ROOT + " EMNIST/raw/"),
    (["run", "data=cifar10"], NULL_ROOT + " cifar-10-batches-py/data_batch_1"),
    (["run", "data=svhn"], NULL_ROOT + " train_32x32.mat"),
    (["run", "data=flowers102", "data.root=nowhere"], "flowers-102/ with jpg/"),
    (["run", "data=eurosat", "data.root=nowhere"], "eurosat/2750/"),
    (["run", "data=fashion_mnist", "data.val_split=70000"], "does not split 60000"),
    (["run", "data=fashion_mnist", "data.val_split=0.9999999"], "would hold out 60000 of 60000"),
    (
        ["run", *TINY_IMAGES, "data.root=images", "data.mean=[a,b,c]", "data.std=[1,1,1]"],
        "data.mean / data.std: numbers",
    ),
    (["run", "data=arrays"], "needs argument 'train'"),
    (["run", "data=arrays", "data.train=missing.csv"], "missing.csv does not exist"),
    (["run", "data=arrays", "data.train=notes.txt"], "is not a .csv, .npy or .npz file"),
    (["run", "data=arrays", "data.train=table.csv", "data.target=nope"], "no column 'nope'"),
    (["run", "data=arrays", "data.train=table.csv", "data.task=ranking"], "not one of"),
    # issue 28: a table that would train on garbage
    (["run", "data=arrays", "data.train=semicolon.csv"], "';' separates its values"),
    (["run", "data=arrays", "data.train=target_only.npy"], "target_only.npy has no feature"),
    (["run", "data=arrays", "data.train=complex.npy"], "complex.npy holds complex numbers"),
    (
        ["run", "data=arrays", "data.train=empty_label.csv"],
        "empty_label.csv has no target at row 3",
    ),
    (["run", "data=arrays", "data.train=nan.csv"], "nan.csv, column 'b', holds NaN"),
    (
        ["run", "data=arrays", "data.train=nan_target.npz", "data.task=regression"],
        "nan_target.npz (y) has no target at index 1 (nan)",
    ),
    (
        ["run", "data=arrays", "data.train=huge.csv", "data.standardize=false"],
        "huge.csv, column 'a', holds values beyond float32's range",
    ),
    (["run", "imports=[corpus_bad_dataset]", "data=pair"], "returned tuple, not expctl.Splits"),
    # the README's model example as written (its body `...`): a factory that returns None
    (["run", "imports=[corpus_bad_dataset]", "model=nothing"], "returned NoneType for 'model'"),
    # issue 16: reading a sweep (`swept`: a sweep whose 2 trials have not started)
    (["sweep", "table", "swept", "--filter", "status=complete"], "Did you mean 'completed'?"),
    (["sweep", "table", "swept", "--filter", "stauts=failed"], "Did you mean 'status'?"),
    (["sweep", "table", "swept", "--filter", "status"], "expected KEY=VALUE"),
    (["sweep", "table", "swept", "--sort=-optm.lr"], "--sort optm.lr: no such column"),
    (["sweep", "table", "--csv", "swept", "--sort", "wall"], "Did you mean 'wall_s'?"),
    (["sweep", "best", "swept", "--json"], "applies to `expctl sweep table` only"),
    (["sweep", "best", "swept"], "no completed trial yet"),
    (["sweep", "resume", "swept", "optim.lr=0.1"], "`expctl sweep resume` cannot change optim.lr"),
    (["sweep", "resume", "swept", "sweep.max_concurrent=0"], "0 is below the minimum 1"),
    (
        ["sweep", "best", "swept", "sweep.max_concurrent=2"],
        "`expctl sweep best` takes no overrides",
    ),
    (["sweep", "table", "swept", "--skip-failed"], "applies to `expctl sweep resume` only"),
    (["sweep", "table", "--json", "."], "not a sweep directory"),
    (["sweep", "plot", "."], "not a sweep directory"),
    # a sweep's values without -m: Hydra's message was cut off mid-sentence
    (
        ["show", "optim.lr=0.1,0.2"],
        "optim.lr=0.1,0.2: a sweep's values, which only `expctl run -m`",
    ),
    (["run", "optim.lr=range(1,3)"], "HINT: sweep it: expctl run -m 'optim.lr=range(1,3)'"),
    (["status", "swept"], "swept is a sweep: `expctl sweep table swept` lists its trials"),
    (["diff", "swept", "gone_run"], "swept is a sweep: `expctl sweep table swept`"),
    # issue 16: a run's `imports:` module deleted from where the run found it
    (
        ["run", "-C", "gone_run/config.yaml"],
        "imported it from /moved/gone_module_xyz.py, which is gone",
    ),
    # issue 13: best checkpoints, early stopping, metric schedulers, weights-only starts, eval
    (["run", "checkpoint.mode=up"], "checkpoint.mode: 'up' is not one of: min, max"),
    (["run", "train.early_stop.mode=lower"], "train.early_stop.mode: 'lower' is not one of"),
    (
        ["run", "train.activation_checkpointing=true"],
        "train.activation_checkpointing: 'true' is not one of: none, full, selective. It takes one",
    ),
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
    (
        ["run", "-m", "sweep=random", "train.max_epochs=interval(1,3)"],
        "HINT: draw integers with train.max_epochs='tag(int, interval(1,3))'",
    ),
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
    # a grid this large is checked by forked copies of the driver: the first bad point is named
    (["run", "-m", "data.batch_size=1,2,3,4,5,6,7,8,0,-1"], "data.batch_size: 0 is below"),
    # a sweep's share of the machine, and what Population Based Training cannot mutate
    (["run", "-m", "optim.lr=0.1,0.2", "sweep.gpus_per_trial=1"], "no GPU visible to expctl"),
    (["run", "-m", "optim.lr=0.1,0.2", "sweep.gpus_per_trial=1.5"], "sweep.gpus_per_trial=2"),
    (["run", "-m", "optim.lr=0.1,0.2", "sweep.cpus_per_trial=4096"], "or fewer"),
    (["run", "-m", "optim.lr=0.1,0.2", "sweep.max_concurrent=0"], "below the minimum"),
    (
        ["run", "-m", "sched=none", "sweep.scheduler=pbt", "model.hidden=[8],[16]", "model=mlp"],
        "cannot mutate model.hidden",
    ),
    (["run", "-m", "sweep.scheduler=pbt", "optim.lr=0.1,0.2"], "sched=cosine sets too"),
    (
        [
            "run",
            "-m",
            "sched=none",
            "sweep.scheduler=pbt",
            "optim.lr=0.1,0.2",
            "sweep.pbt.interval=3",
        ],
        "never at the last, so none ever would",
    ),
    (
        [
            "run",
            "-m",
            "sched=none",
            "sweep.scheduler=pbt",
            "optim.lr=0.1,0.2",
            "+train.hparam_schedule=[{step: 0, optim: {momentum: 0.5}}]",
        ],
        "PBT writes the schedule itself",
    ),
    (
        [
            "run",
            "-m",
            "sched=none",
            "optim.lr=0.1,0.2",
            "+train.hparam_schedule=[{step: 0, optim: {lr: 0.3}}]",
        ],
        "train.hparam_schedule sets optim.lr from step 0, and the sweep varies optim.lr",
    ),
    (
        ["run", "-m", "sched=none", "sweep.scheduler=pbt", "sweep.pruner=asha", "optim.lr=0.1,0.2"],
        "PBT decides itself",
    ),
    (
        [
            "run",
            "-m",
            "sched=none",
            "sweep.scheduler=pbt",
            "sweep.pbt.quantile=0.9",
            "optim.lr=0.1,0.2",
        ],
        "must not overlap",
    ),
    (  # a trial drew 2.74 after the sweep existed: exit 2 and a sweep directory left
        ["run", "-m", "sched=none", "sweep.scheduler=pbt", "loss.label_smoothing=interval(0, 5)"],
        "loss.label_smoothing=5.0: not between 0 and 1",
    ),
    (["run", "-m", "--repeat", "0", "optim.lr=0.1"], "--repeat 0: each configuration runs once"),
    # the sweep's own settings swept: they ran the first point's value for every trial (or
    # ranked the trials by another metric or direction than each was run for)
    (["run", "-m", "sweep.n_trials=1,2", "optim.lr=0.1,0.2"], "sweep.n_trials is swept, but"),
    (["run", "-m", "sweep.mode=min,max", "optim.lr=0.1,0.2"], "sweep.mode is swept, but"),
    (["run", "-m", "run.name=a,b", "optim.lr=0.1"], "run.name is swept, but"),
    (["run", "-m", "launcher=local,inline", "optim.lr=0.1"], "launcher is swept, but"),
    (["run", "-m", "--repeat", "2", "train.seed=1,2"], "train.seed is swept and --repeat 2"),
    (  # a list of 1e20 trials filled the memory
        ["run", "-m", "--repeat", "99999999999999999999", "optim.lr=0.1"],
        "1 configuration(s) x 99,999,999,999,999,999,999 seed(s), more than 100,000 trials",
    ),
    (
        ["run", "-m", "sweep.sampler=random", "sweep.n_trials=99999999999", "optim.lr=choice(1,2)"],
        "more than 100,000 trials",
    ),
    (  # a copy would repeat its donor step for step
        [
            "run",
            "-m",
            "sched=none",
            "sweep.scheduler=pbt",
            "sweep.pbt.factors=[1.0]",
            "optim.lr=0.1,0.2",
        ],
        "sweep.pbt.factors=[1.0] never changes a number",
    ),
    (  # the sweep went to run.root, run.dir unused
        ["run", "-m", "optim.lr=0.1,0.2", "run.dir=mine"],
        "run.dir=mine with -m: a sweep makes its own directory",
    ),
    (  # a probability over 1 was taken as "always"
        ["run", "-m", "sched=none", "sweep.scheduler=pbt", "sweep.pbt.resample_probability=2"],
        "sweep.pbt.resample_probability: 2.0 is above the maximum 1",
    ),
    (
        [
            "run",
            "-m",
            "sched=none",
            "sweep.scheduler=pbt",
            "launcher=slurm",
            "launcher.nodes=2",
            "optim.lr=0.1,0.2",
        ],
        "runs each trial as one task (this trial: 2 tasks",
    ),
    (
        ["run", "-m", "sched=none", "sweep.scheduler=pbt", "sweep.n_trials=1", "optim.lr=0.1,0.2"],
        "with a population of 1",
    ),
    (
        ["run", "train.hparam_schedule=[{step: 0, model: {hidden: [8]}}]"],
        "only optimizer and loss arguments",
    ),
    (
        [
            "run",
            "sched=none",
            "train.hparam_schedule=[{step: 5, optim: {lr: 0.1}}, {step: 2, optim: {lr: 0.2}}]",
        ],
        "increasing",
    ),
    (
        ["run", "sched=none", "train.hparam_schedule=[{step: 0, optim: {lrr: 0.1}}]"],
        "Did you mean 'lr'",
    ),
    (  # the optimizer refuses it when built; from the schedule it trained on to exit 0
        ["run", "sched=none", "train.hparam_schedule=[{step: 3, optim: {lr: -1}}]"],
        "train.hparam_schedule[0].optim: optim.lr=-1: negative",
    ),
    (["run", "-m", "optim.lr=range(0,1,0.0)"], "range() needs a step other than 0"),
    (["run", "-m", "optim.lr=range(3,1)"], "optim.lr: the sweep gives it no value"),
    (["run", "-m", "optim.lr=range(0,inf,0.1)"], "range() needs finite numbers"),
    (["run", "-m", "model=glob(zz*)"], "model: the sweep gives it no value"),
    (["run", "-m", "optim.lr=glob(*)"], "'optim.lr' is not one"),
    (["run", "-C", "self_twice.yml"], "defaults lists _self_ twice"),
    # issue 28: values torch takes only to fail in the first step (they were tracebacks)
    (["run", "optim.lr=1e308"], "optim.lr=1e+308: beyond float32's range"),
    (["run", "optim=adam", "optim.betas=[0.9,1e300]"], "optim.betas[1]=1e+300: beyond float32"),
    (["run", "data=synthetic", "data.shape=[]"], "data.shape=[]: one sample's shape needs"),
    (["run", "data=synthetic", "data.shape=[0]"], "data.shape=[0]: one sample's shape needs"),
    (["run", "data=synthetic", "data.shape=[100000,100000]"], "the limit of one synthetic split"),
    (["run", "data=synthetic", "data.num_samples=-5"], "HINT: e.g. data.num_samples=4096"),
    (["run", "train.seed=12345678901234567890123"], "above the maximum 9223372036854775807"),
    (["run", "train.seed=-1"], "train.seed: -1 is below the minimum 0"),
    (["run", "sweep.seed=4294967296"], "sweep.seed: 4294967296 is above the maximum 4294967295"),
    (["run", "loss.label_smoothing=5"], "loss.label_smoothing=5.0: not between 0 and 1"),
    (["run", "loss.ignore_index=12345678901234567890123"], "outside the 64-bit integers"),
    (["run", "launcher.rdzv_timeout=1e308"], "launcher.rdzv_timeout: 1e+308 is above the maximum"),
    (
        ["run", "launcher=local", "launcher.collective_timeout=1e308"],
        "launcher.collective_timeout: 1e+308 is above the maximum 2592000",
    ),
    (["run", *TINY_IMAGES, "data.root=images", "data.image_size=100000"], "from 8 to 8192"),
    (["run", "data=imagenet", "data.image_size=4"], "data.image_size=4: images are resized"),
    (
        ["run", "data=imagenet", "data.root=nowhere", "model=cnn"],
        "nowhere (expected train/ and val/ class folders and "
        "ILSVRC2012_devkit_t12.tar.gz or meta.bin; missing: train, val, meta.bin or",
    ),
    (
        ["show", "data=imagenet", "data.root=images"],
        "missing: meta.bin or ILSVRC2012_devkit_t12.tar.gz",
    ),
    *(
        []
        if importlib.util.find_spec("scipy")
        else [
            (
                ["run", "data=imagenet", "data.root=imagenet_devkit", "model=cnn"],
                "which torchvision makes from it with scipy, not installed",
            )
        ]
    ),
    (["run", "run.root=" + "r" * 300], "run.root is too long here (3"),
    (["run", "run.root=" + "/r" * 2100], "run.root is too long here (4"),
    (["run", "run.dir=" + "d" * 300], "run.dir is too long here (3"),
    # ... and files, met once the run directory exists: it is removed
    ([*ARRAYS, "data.train=labels_big.csv"], "class label 1700000000 makes 1700000001 classes"),
    ([*ARRAYS, "data.train=labels_big.npz"], "makes 2000000000001 classes"),
    ([*ARRAYS, "data.train=labels_inf.npz"], "labels_inf.npz (y) has no target at index 2 (inf)"),
    ([*ARRAYS, "data.train=truncated.npz"], "truncated.npz is not a readable NumPy file"),
    ([*ARRAYS, "data.train=wide_field.csv"], "wide_field.csv line 3 is not a CSV table"),
    ([*ARRAYS, "data.train=latin1.csv"], "latin1.csv is not a CSV table"),
    (
        ["run", "model=vit_b_16", "data=synthetic", "data.shape=[3,28,28]", "data.num_samples=8"],
        "model=vit_b_16 takes 224 x 224 images; the data gives 28 x 28",
    ),
    (["run", *TINY_IMAGES, "data.root=bomb_images"], "exceeds limit of 178956970 pixels"),
    # ... an environment variable that a config interpolates and this shell lacks
    (["show", "-C", "env_unset.yml"], "${oc.env:EXPCTL_CORPUS_UNSET} needs the environment var"),
    (["eval", "env_run"], "env.TOKEN: ${oc.env:EXPCTL_CORPUS_UNSET} needs the environment var"),
    # ... -C at what is no file, or no text
    (["run", "-C", "folder.yml"], "-C folder.yml: a folder"),
    (["run", "-C", "fifo.yml"], "-C fifo.yml: not a regular file"),
    (["run", "-C", "zero.yml"], "-C zero.yml: not a regular file"),
    (["run", "-C", "unreadable.yml"], "HINT: a config is YAML text saved as UTF-8"),
    (["show", "-C", "many_keys.yml"], "more than 10000 values, the limit for a config file"),
    # ... a preset or group file named by a path: read only from conf/ and beside the -C file
    (["show", "experiment=../../x"], "experiment=../../x: a name from conf/experiment/"),
    (["show", "experiment=/etc/passwd"], "experiment=/etc/passwd: a name from conf/experiment/"),
    (["show", "-C", "dir/up.yml", "model=../../mlp_up"], "model=../../mlp_up: a name from conf/"),
    (["show", "-C", "unicode_name.yml"], "may only hold ASCII letters"),
    # ... a sweep whose own files are damaged (its journal, its spec)
    (["sweep", "resume", "swept_garbage"], "swept_garbage/journal.log is damaged"),
    (["sweep", "resume", "swept_empty"], "swept_empty/journal.log is damaged"),
    (["sweep", "table", "swept_deep"], "swept_deep/journal.log is damaged (RecursionError"),
    (["sweep", "best", "swept_deep"], "swept_deep/journal.log is damaged (RecursionError"),
    (["sweep", "resume", "swept_deep"], "swept_deep/journal.log is damaged (RecursionError"),
    (["sweep", "resume", "swept_op"], "swept_op/journal.log is damaged (AssertionError"),
    (["sweep", "resume", "swept_spec"], "swept_spec/sweep.json is damaged"),
    (["sweep", "resume", "swept_no_dims"], "swept_no_dims/sweep.json is damaged (no 'dims')"),
    (["sweep", "resume", "swept_no_plain"], "sweep.json is damaged (no 'plain')"),
    (["sweep", "resume", "swept_no_config_file"], "is damaged (no 'config_file')"),
    (["sweep", "resume", "swept", "sweep.cpus_per_trial=64"], "sweep.cpus_per_trial=64 but"),
    (["sweep", "resume", "swept_nojournal"], "not a sweep directory (no journal.log)"),
    (["sweep", "best", "nowhere"], "nowhere: no such directory"),
    (["sweep", "resume", "swept", "sweep.max_concurent=2"], "Did you mean 'sweep.max_concurrent'?"),
    # found by a new user (stop 35): a traceback, and a run directory left behind, before
    (["run", "data=synthetic", "model.width=0"], "model.width=0: a size of the model, at least 1"),
    (["run", "model=mlp", "model.hidden=[16,0]"], "model.hidden[1]=0: a size of the model"),
    (["run", "data=synthetic", "model.dropout=1.5"], "model.dropout=1.5: a probability"),
    (["run", "optim=adam", "optim.betas=[0.9]"], "optim.betas=[0.9]: two numbers"),
    (["run", "optim=adam", "optim.betas=[0.9,1.0]"], "each from 0 up to (not including) 1"),
    (["run", "optim.lr=-1"], "optim.lr=-1: negative"),
    (["run", "optim=adamw", "optim.weight_decay=-0.1"], "optim.weight_decay=-0.1: negative"),
    # issue 27: token files that cannot be a language model's data, and model sizes that do
    # not fit them or each other
    (
        ["run", "data.root=tokens_missing", *TOKENS],
        "tokens_missing (expected train.bin and val.bin)",
    ),
    (["run", "data.root=tokens_noval", *TOKENS], "tokens_noval (expected val.bin)"),
    (["run", "data.root=tokens_odd", *TOKENS], "has 801 bytes, not a whole number of uint16"),
    (["run", "data.root=tokens_short", *TOKENS], "fewer than one window of data.block_size + 1"),
    (["run", "data.root=tokens_wide", *TOKENS], "reads as uint32 tokens, not data.dtype=uint16"),
    (["run", "data.dtype=int8", *TOKENS], "data.dtype='int8' is not one of: uint16, uint32"),
    (
        ["run", "data.vocab_size=256", "data.root=tokens_ok", *TOKENS],
        "holds token id 299, beyond data.vocab_size=256",
    ),
    (["run", "model.block_size=32", *TOKENS], "model.block_size=32, but data.block_size is 16"),
    (["run", "model.n_head=5", *TOKENS], "over model.n_head=5 heads: each head's width"),
    (["run", "model.pos=alibi", *TOKENS], "model.pos='alibi' is not one of: rotary, learned"),
    # a model or step of one kind and data of another: said before training, not in a forward
    (
        ["run", "data=tokens", "model=resnet18", "train.step=lm", "train.device=cpu"],
        "model=resnet18 takes images (channels, height, width); data=tokens gives samples of",
    ),
    (["run", "model=gpt", "train.device=cpu"], "model=gpt takes windows of token ids"),
    (
        ["run", "train.step=lm", "train.device=cpu"],
        "train.step=lm takes windows of token ids (data=tokens); data=fashion_mnist gives",
    ),
    # issue 27: sharded training (FSDP2) and its checkpoints
    (["run", "train.strategy=fsdq"], "Did you mean 'fsdp'"),
    (["run", "train.strategy=hsdp"], "but this run has one node (launcher=inline)"),
    (["run", "launcher=local", "train.strategy=hsdp"], "has one node (launcher=local)"),
    (
        [
            *["run", "launcher=slurm", "launcher.nodes=2", "launcher.tasks_per_node=2"],
            *["train.strategy=hsdp", "train.fsdp.shard_size=3"],
        ],
        "shard groups of 3 rank(s) do not divide the 4 ranks of 2 nodes",
    ),
    (["run", "train.fsdp.shard_size=2"], "train.fsdp.shard_size=2 is for train.strategy=hsdp"),
    (["run", "train.strategy=fsdp", "sweep.scheduler=pbt"], "for train.strategy=ddp only"),
    (
        [*SYNTHETIC, "imports=[corpus_bad_dataset]", "model=scalar_gain", "train.strategy=fsdp"],
        "parameter 'gain' of 'model' is a scalar: FSDP shards",
    ),
    (
        [*SYNTHETIC, "imports=[corpus_bad_dataset]", "model=lazy_head", "train.strategy=fsdp"],
        "before the first forward (a lazy layer): FSDP cannot shard it",
    ),
    (
        [*SMALL_RUN, "train.strategy=fsdp", "checkpoint.resume=other_model.dcp"],
        "cannot be used: its models do not match",
    ),
    ([*SMALL_RUN, "checkpoint.resume=other_model.dcp"], "its models do not match"),
    ([*SMALL_RUN, "checkpoint.init=other_model.dcp"], "do not fit: model 'model' missing 4"),
]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus's input files, made once for the module: each case must leave them as they
    are (checked), so cases can share them."""
    return _corpus_inputs(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """The corpus's input files in the test's own folder (for the in-process cases)."""
    return _corpus_inputs(tmp_path)


def _corpus_inputs(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("model: cnn\n")
    (tmp_path / "broken.yml").write_text("model: {name: cnn\ntrain: [\n")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    unreadable = tmp_path / "unreadable.yml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "typo_section.yml").write_text("trian:\n  max_epochs: 2\n")
    (tmp_path / "typo_key.yml").write_text("train:\n  max_epoch: 2\n")
    (tmp_path / "bad_default.yml").write_text("defaults:\n  - model: resnet19\n")
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "empty").mkdir()  # a folder the user made, for a run.dir
    (tmp_path / "val_split_one.yml").write_text("data: {val_split: 1.0, subset: 600}\n")
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
    _issue_28_inputs(tmp_path)
    _token_inputs(tmp_path)
    _sweep_not_started(tmp_path / "swept")
    _damaged_sweeps(tmp_path, tmp_path / "swept")
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
    image_tree(tmp_path / "broken_class", classes=2, per_class=2)
    (tmp_path / "broken_class" / "class_2").symlink_to(tmp_path / "unmounted" / "class_2")
    image_tree(tmp_path / "looped_class", classes=2, per_class=2)
    (tmp_path / "looped_class" / "loop").symlink_to(tmp_path / "looped_class")
    image_tree(tmp_path / "crossed_class", classes=2, per_class=2)
    (tmp_path / "crossed_class" / "class_1" / "dogs").symlink_to(
        tmp_path / "crossed_class" / "class_0"
    )
    image_tree(tmp_path / "broken_split" / "train", classes=2, per_class=2)
    (tmp_path / "broken_split" / "val").symlink_to(tmp_path / "unmounted" / "val")
    image_tree(tmp_path / "broken_image", classes=2, per_class=2)
    (tmp_path / "broken_image" / "class_1" / "img_001.jpg").unlink()
    (tmp_path / "broken_image" / "class_1" / "img_001.jpg").symlink_to(tmp_path / "unmounted")
    image_tree(tmp_path / "empty_val" / "train", classes=2, per_class=2)
    (tmp_path / "empty_val" / "val").mkdir()
    for sub in ("train", "val"):  # ImageNet with its devkit archive, not yet meta.bin
        (tmp_path / "imagenet_devkit" / sub).mkdir(parents=True)
    (tmp_path / "imagenet_devkit" / "ILSVRC2012_devkit_t12.tar.gz").write_bytes(b"")
    image_tree(tmp_path / "no_images" / "cat", classes=1, per_class=2)
    (tmp_path / "no_images" / "dog").mkdir()
    (tmp_path / "no_images" / "dog" / "notes.txt").write_text("no image here")
    for split in ("train", "val"):
        bad = image_tree(tmp_path / "corrupt_images" / split, classes=2, per_class=2)
        for p in bad.rglob("*.*"):
            p.write_bytes(p.read_bytes()[:40])
    (tmp_path / "table.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    (tmp_path / "semicolon.csv").write_text("a;b;y\n1;2;0\n3;4;1\n")
    (tmp_path / "empty_label.csv").write_text("a,b,y\n1,2,cat\n3,4,\n5,6,dog\n")
    (tmp_path / "nan.csv").write_text("a,b,y\n1,2,0\n3,nan,1\n")
    (tmp_path / "huge.csv").write_text("a,b,y\n1e39,2,0\n3,4,1\n")
    np.save(tmp_path / "target_only.npy", np.arange(4.0).reshape(4, 1))
    np.save(tmp_path / "complex.npy", np.arange(12.0).reshape(4, 3) + 1j)
    np.savez(tmp_path / "nan_target.npz", x=np.ones((4, 2)), y=np.array([0.5, np.nan, 1, 2]))
    (tmp_path / "corpus_bad_dataset.py").write_text(
        "import expctl, torch\n"
        "@expctl.register('datasets')\n"
        "def pair():\n"
        "    ds = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4).long())\n"
        "    return ds, ds\n"
        "@expctl.register('models')\n"
        "def nothing(num_classes: int = 10):\n"
        "    ...\n"
        "class Gain(torch.nn.Linear):\n"
        "    def __init__(self):\n"
        "        super().__init__(6, 3)\n"
        "        self.gain = torch.nn.Parameter(torch.tensor(1.0))\n"
        "@expctl.register('models')\n"
        "def scalar_gain():\n"
        "    return Gain()\n"
        "@expctl.register('models')\n"
        "def lazy_head(num_classes: int = 3):\n"
        "    return torch.nn.LazyLinear(num_classes)\n"
    )
    _other_model_checkpoint(tmp_path / "other_model.dcp")


def _other_model_checkpoint(folder: Path) -> None:
    """A sharded checkpoint (DCP's files and the payload beside them) of a model with other
    parameters than SMALL_RUN's."""
    import warnings

    import torch.distributed.checkpoint as dcp

    state = {"models": {"model": {"w.weight": torch.zeros(2, 2)}}}
    with warnings.catch_warnings():  # DCP's note that it saves in one process
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save({"format": 1, "step": 3, "epoch": 0, "batch": 3}, folder / "extra.pt")


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


def _token_inputs(tmp_path: Path) -> None:
    """Token files: fine (ids up to 299), an odd number of bytes, too short, none, uint32."""
    for name, ids in (("tokens_ok", np.arange(400) % 300), ("tokens_short", np.arange(10))):
        (tmp_path / name).mkdir()
        for split in ("train", "val"):
            ids.astype(np.uint16).tofile(tmp_path / name / f"{split}.bin")
    (tmp_path / "tokens_noval").mkdir()
    np.arange(400, dtype=np.uint16).tofile(tmp_path / "tokens_noval" / "train.bin")
    (tmp_path / "tokens_odd").mkdir()
    (tmp_path / "tokens_odd" / "train.bin").write_bytes(b"\0" * 801)
    (tmp_path / "tokens_odd" / "val.bin").write_bytes(b"\0" * 800)
    (tmp_path / "tokens_missing").mkdir()
    (tmp_path / "tokens_wide").mkdir()  # written as uint32, read as the default uint16
    for split in ("train", "val"):
        (np.arange(400) % 300 + 1).astype(np.uint32).tofile(
            tmp_path / "tokens_wide" / f"{split}.bin"
        )


def _issue_28_inputs(tmp_path: Path) -> None:
    """Data files past what their readers took (labels, sizes, a truncated archive), a -C file
    that is no file, a config naming a variable the shell lacks."""
    import numpy as np

    rows = "".join(f"{i},{i % 5},{[0, 1, 1_700_000_000][i % 3]}\n" for i in range(12))
    (tmp_path / "labels_big.csv").write_text("a,b,y\n" + rows)
    x = np.zeros((12, 2), dtype=np.float32)
    np.savez(tmp_path / "labels_big.npz", x=x, y=np.array([0, 1, 2_000_000_000_000] * 4))
    np.savez(tmp_path / "labels_inf.npz", x=x, y=np.array([0.0, 1.0, np.inf] * 4))
    np.savez(tmp_path / "whole.npz", x=x, y=np.array([0, 1, 2] * 4))
    whole = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "wide_field.csv").write_text("a,b,y\n1,2,0\n3," + "4" * 140_000 + ",1\n")
    (tmp_path / "latin1.csv").write_bytes("a,b,y\n1,2,caf\xe9\n".encode("latin-1"))
    bombs = tmp_path / "bomb_images"
    for split in ("train", "val"):
        for label in ("a", "b"):
            (bombs / split / label).mkdir(parents=True)
            (bombs / split / label / "huge.png").write_bytes(png_header(20_000, 20_000))
    (tmp_path / "folder.yml").mkdir()
    os.mkfifo(tmp_path / "fifo.yml")
    (tmp_path / "zero.yml").symlink_to("/dev/zero")
    (tmp_path / "many_keys.yml").write_text("".join(f"k{i}: {i}\n" for i in range(9000)))
    (tmp_path / "dir" / "model").mkdir(parents=True)
    (tmp_path / "dir" / "up.yml").write_text("train: {max_epochs: 1}\n")
    (tmp_path / "mlp_up.yaml").write_text("name: mlp\n")  # dir/model/../../mlp_up.yaml
    (tmp_path / "unicode_name.yml").write_text("run: {name: h\u00e9llo}\n", encoding="utf-8")
    (tmp_path / "env_unset.yml").write_text("env: {TOKEN: '${oc.env:EXPCTL_CORPUS_UNSET}'}\n")
    (tmp_path / "env_run").mkdir()
    (tmp_path / "env_run" / "config.yaml").write_text(
        "env: {TOKEN: '${oc.env:EXPCTL_CORPUS_UNSET}'}\n"
    )


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels (Pillow reads the size, then refuses it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    head = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + head + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _damaged_sweeps(tmp_path: Path, good: Path) -> None:
    """Copies of a sweep with its journal or spec damaged."""
    lines = (good / "journal.log").read_text().splitlines(keepends=True)
    journals = {
        "swept_garbage": "garbage\n",
        "swept_empty": "",
        "swept_deep": "".join(lines) + "[" * 100_000 + "]" * 100_000 + "\n",
        "swept_op": "".join(lines) + '{"op_code": 99}\n',
    }
    for name, text in journals.items():
        shutil.copytree(good, tmp_path / name)
        (tmp_path / name / "journal.log").write_text(text)
    shutil.copytree(good, tmp_path / "swept_spec")
    (tmp_path / "swept_spec" / "sweep.json").write_text('{"points": "x"}')
    shutil.copytree(good, tmp_path / "swept_nojournal")
    (tmp_path / "swept_nojournal" / "journal.log").unlink()
    spec = json.loads((good / "sweep.json").read_text())
    for key in ("dims", "plain", "config_file"):  # JSON still, but not what makes its trials
        shutil.copytree(good, tmp_path / f"swept_no_{key}")
        cut = {k: v for k, v in spec.items() if k != key}
        (tmp_path / f"swept_no_{key}" / "sweep.json").write_text(json.dumps(cut))


def _sweep_not_started(path: Path) -> None:
    """A grid sweep over optim.lr=0.1,0.2 whose driver stopped before its first trial."""
    from expctl.config.schema import SweepConfig
    from expctl.jobs.study import open_study
    from expctl.layout import SweepDir

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


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Where a CLI process of the corpus could write besides its working directory: its home,
    its temporary folder and expctl's cache, each an empty folder of the module's own."""
    base = tmp_path_factory.mktemp("corpus-env")
    places = {name: base / name for name in ("HOME", "TMPDIR", "EXPCTL_CACHE_DIR")}
    for folder in places.values():
        folder.mkdir()
    return places


@pytest.mark.parametrize(("args", "expected"), CORPUS, ids=[" ".join(a)[:60] for a, _ in CORPUS])
def test_bad_input_is_a_short_error_with_exit_2_and_nothing_on_disk(
    args: list[str], expected: str, corpus_files: Path, sandbox: dict[str, Path]
) -> None:
    """`expctl ARGS`, a real process (forked from the warm server, its own environment), exits
    2 with one or two lines holding `expected` and leaves every file where it could write as it
    was: the working directory (the default run.root) and its sub-folders, home, the temporary
    folder; expctl's cache may only gain complete entries."""
    places = [corpus_files, sandbox["HOME"], sandbox["TMPDIR"]]
    before = snapshot(*places)
    cached = snapshot(sandbox["EXPCTL_CACHE_DIR"])
    env = conftest.cli_env(EXPCTL_TEST_SECRET=SECRET, **{k: str(v) for k, v in sandbox.items()})
    try:
        proc = conftest.expctl(*args, cwd=corpus_files, env=env, check=False, timeout=120)
        _check_refusal(proc.returncode, proc.stdout, proc.stderr, expected)
        assert snapshot(*places) == before, "nothing half-written on disk"
    finally:
        _remove_new(before, snapshot(*places))  # a failed case leaves the next ones theirs
    new = set(snapshot(sandbox["EXPCTL_CACHE_DIR"])) - set(cached)
    assert not [p for p in new if p.endswith(".tmp")], f"a half-written cache file: {new}"


SECRET = "hunter2 is my password"


def snapshot(*roots: Path) -> dict[str, tuple[int, ...]]:
    """Every path under `roots`, recursively (links not followed): a file's size, modification
    time and mode, a folder's existence (its own times change when an entry comes and goes)."""
    out: dict[str, tuple[int, ...]] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                st = os.lstat(os.path.join(folder, name))
                is_dir = stat.S_ISDIR(st.st_mode)
                out[os.path.join(folder, name)] = (
                    () if is_dir else (st.st_size, st.st_mtime_ns, st.st_mode)
                )
    return out


def _remove_new(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> None:
    for path in sorted(set(after) - set(before), reverse=True):  # children before folders
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def _check_refusal(code: int, out: str, err: str, expected: str) -> None:
    """Exit 2; one or two lines on stderr (`expctl: error: ...`, then `  HINT: ...`) holding
    `expected`; nothing on stdout; no traceback; no value of the environment."""
    assert code == 2, f"exit {code}: {err[-2000:]}"
    assert out == "", "nothing is printed before the error (`expctl show` included)"
    assert expected in err, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("expctl: error: "), err
    assert len(lines) == 1 or lines[1].startswith("  HINT: "), err
    assert "Traceback" not in err
    assert "hunter2" not in err, "a value from the environment is never printed"


@pytest.mark.parametrize("logger", ["mlflow", "wandb", "tensorboard"])
def test_a_logger_whose_package_is_missing_names_the_extra_before_any_run_dir(
    logger: str,
    corpus_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process: a missing package is simulated in this interpreter's sys.modules."""
    monkeypatch.setitem(sys.modules, logger, None)  # find_spec: not installed
    monkeypatch.chdir(corpus_dir)
    monkeypatch.setenv("EXPCTL_TEST_SECRET", SECRET)
    before = snapshot(corpus_dir)
    code = cli.main([*SMALL_RUN, f"logger=[csv,{logger}]"])
    out, err = capsys.readouterr()
    _check_refusal(code, out, err, f"logger {logger} needs the '{logger}' package")
    assert f"HINT: pip install 'expctl[{logger}]'" in err
    assert snapshot(corpus_dir) == before, "nothing half-written on disk"


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 40
