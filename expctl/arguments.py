"""The ``expctl`` command line's grammar: its commands, options and help texts (argparse), built
without importing anything heavy (`expctl --help` loads neither torch nor Hydra); `cli.py` runs
what it parses."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from expctl.config.schema import RunConfig
from expctl.errors import UserError

EPILOG = """examples:
  expctl run                                    train the built-in default (Fashion-MNIST, small CNN)
  expctl run -C my.yml optim.lr=0.05            your config file + Hydra-style overrides
  expctl run -C my.yml launcher=local launcher.nproc=2   2 DDP workers on this machine
  expctl run -C my.yml -m optim.lr=0.01,0.1     a sweep (Hydra multirun)
  expctl eval RUN_DIR --split test               score the run's best (or last) checkpoint again
  expctl runs --sort=-val/acc                   every run under ./runs: the settings that differ, metrics
  expctl diff runs/A runs/B                     two runs' config and metrics side by side
  expctl show -C my.yml                         the resolved config and the detected environment
  expctl list models                            registered names and their arguments
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="expctl",
        description="Config-driven PyTorch DDP experiments: one YAML, a laptop, a GPU box or a Slurm cluster.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from expctl import __version__

    p.add_argument("--version", action="version", version=f"expctl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run, show = (
        sub.add_parser(
            name,
            help=text,
            add_help=False,
            epilog=PRECEDENCE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for name, text in (
            ("run", "compose the config, freeze it into a run directory, train"),
            ("show", "print the resolved config and environment without training"),
        )
    )
    for sp in (run, show):
        sp.add_argument(
            "-h", "--help", action=_GroupsHelp, help="this help, with every config group's options"
        )
        sp.add_argument(
            "-C", "--config", metavar="FILE", help="a .yml/.yaml config (default: built-in)"
        )
        over = sp.add_argument(
            "overrides", nargs="*", metavar="KEY=VALUE", help="Hydra-style overrides"
        )
        over.complete = {"bash": "_expctl_overrides", "zsh": "_expctl_overrides"}  # type: ignore[attr-defined]
    run.add_argument(
        "-m", "--multirun", action="store_true", help="sweep over comma-separated values"
    )
    run.add_argument(
        "--wait", action="store_true", help="launcher=slurm: follow the job until it ends"
    )
    run.add_argument("--repeat", type=int, metavar="N", help="with -m: N seeds per configuration")
    ev = sub.add_parser(
        "eval",
        help="score a run's checkpoint on a split or other data: RUN_DIR/eval/NAME.json",
        epilog="overrides change the run's config for this evaluation: data.* (other data), "
        "launcher=local launcher.nproc=2, data.val_batch_size, train.device",
    )
    ev.add_argument("run_dir")
    ev.add_argument("--split", default="val", help="val | test | train (default: val)")
    ev.add_argument(
        "--which",
        metavar="best|last|PATH",
        help="the checkpoint (default: best when the run monitored a metric, else last)",
    )
    ev.add_argument("--name", help="the result's name (default: SPLIT-CHECKPOINT)")
    ev.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra-style overrides")
    st = sub.add_parser("status", help="job, state, requeues, progress and last metrics of a run")
    st.add_argument("run_dir")
    sw = sub.add_parser("sweep", help="a sweep's trials: table | best | resume | plot SWEEP_DIR")
    sw.add_argument("action", choices=("table", "best", "resume", "plot"))
    sw.add_argument("sweep_dir")
    sw.add_argument(
        "--skip-failed",
        action="store_true",
        help="resume: leave failed trials as they are (the others still run)",
    )
    _table_options(sw, "table: ", "trials", "best first")
    rs = sub.add_parser(
        "runs", help="every run under ROOTs (sweep trials too): status, differing settings, metrics"
    )
    rs.add_argument(
        "roots",
        nargs="*",
        default=[RunConfig.root],
        metavar="ROOT",
        help=f"default: ./{RunConfig.root}",
    )
    _table_options(rs, "", "runs", "by start time")
    rs.add_argument(
        "--columns",
        metavar="COL,...",
        help="these columns, in this order (names or globs: 'val/*,optim.*,wall_s'; any config "
        "key); default: the metrics, then the settings that differ",
    )
    df = sub.add_parser("diff", help="two runs side by side: config keys that differ, metrics")
    df.add_argument("run_a")
    df.add_argument("run_b")
    lst = sub.add_parser(
        "list", help="registered models, datasets, optimizers, schedulers, losses, steps"
    )
    kind = lst.add_argument("kind", nargs="?", help="one kind (default: all)")
    kind.complete = {"bash": "_expctl_kinds", "zsh": "_expctl_kinds"}  # type: ignore[attr-defined]
    lst.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="also import your module (as the config's imports:)",
    )
    comp = sub.add_parser(
        "completion", help='print a shell completion script: eval "$(expctl completion bash)"'
    )
    comp.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    sub.add_parser("_words")  # hidden: the words completion offers, one a line
    wk = sub.add_parser("_worker")  # hidden: one rank started by the local launcher
    wk.add_argument("run_dir")
    wk.add_argument("--eval", dest="evaluation")  # an Evaluation, as JSON
    wk.add_argument("--config")  # the evaluation's frozen config
    wk.add_argument("--launch")  # the launch it belongs to, as JSON (provenance.json)
    sub.add_parser("_zygote")  # hidden: forks a local sweep's trials (a driver that cannot fork)
    return p


def _table_options(p: argparse.ArgumentParser, prefix: str, rows: str, order: str) -> None:
    """--json, --csv, --sort and --filter of `sweep table` and `runs`."""
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help=f"{prefix}as JSON")
    form.add_argument("--csv", action="store_true", help=f"{prefix}as CSV, one row per {rows[:-1]}")
    p.add_argument(
        "--sort",
        metavar="KEY",
        help=f"{prefix}by a column (--sort=-KEY: descending); default: {order}",
    )
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{prefix}only {rows} with this value (status=failed; also !=, and >, >=, <, <= on "
        "numbers: 'val/acc>0.9'); repeatable",
    )


PRECEDENCE = """precedence, lowest first (the command line always wins):
  schema / signature defaults < conf/config.yaml < experiment picked in the -C file
  < the -C file < experiment=... on the command line < KEY=VALUE and GROUP=NAME on the command line
  a section naming a component (optim: {name: sgd, lr: 0.1}) belongs to it: optim=adam on the
  command line starts from Adam's own defaults, not from sgd's settings
"""


class _GroupsHelp(argparse.Action):
    """`expctl run --help`: argparse's help, then every config group and its options."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help"))
        )

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: object
    ) -> None:
        parser.print_help()
        from expctl import completion
        from expctl.builtin import catalogue

        described = catalogue.describe(wait=False)  # never torch: what is described, else less
        try:
            print("\n" + completion.groups_text(getattr(namespace, "config", None), described))
        except UserError as e:
            print(f"\n(config groups unavailable: {e})")
        parser.exit()
