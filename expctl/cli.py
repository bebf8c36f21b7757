"""The ``expctl`` command. Parsing imports nothing heavy: each command imports its modules inside
its branch (lazy, for speed: `expctl --help` loads neither torch nor Hydra)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from expctl.config.schema import RunConfig
from expctl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USER,
    Interrupted,
    Preempted,
    Reported,
    RunError,
    UserError,
)

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


def _parser() -> argparse.ArgumentParser:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)  # --help prints here
    except BrokenPipeError:  # `expctl run --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    # overrides may come before and after options (`run x=1 -C f.yml y=2`); argparse splits them
    stray = [a for a in extra if a.startswith("-")]
    if args.command == "sweep" and extra and not stray:  # `sweep resume DIR key=value`
        print(f"expctl: error: {_no_overrides(args.action, extra)}", file=sys.stderr)
        return EXIT_USER
    if stray or (extra and args.command not in ("run", "show", "eval")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.command in ("status", "sweep", "runs", "diff", "show", "list", "eval"):
        from expctl.rank.report import warnings_to_stderr

        warnings_to_stderr()
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "show":
            return _show(args)
        if args.command == "list":
            return _list(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "status":
            from expctl.inspect.status import status

            print(status(args.run_dir))
            return 0
        if args.command == "runs":
            return _runs(args)
        if args.command == "diff":
            from expctl.inspect import compare

            print(compare.diff(args.run_a, args.run_b))
            return 0
        if args.command == "completion":
            from expctl import completion

            print(completion.completion_script(_parser(), args.shell))
            return 0
        if args.command == "_words":  # what completion offers for KEY=VALUE (hidden)
            from expctl import completion
            from expctl.builtin import catalogue

            described = catalogue.describe(wait=False)
            print("\n".join(completion.completion_words(described)))
            return 0 if described else EXIT_FAILED  # the shell keeps complete lists only
        if args.command == "_worker":
            from expctl.startup import paused_gc

            with paused_gc():
                from expctl.jobs import launch  # torch

            launch.worker(args.run_dir, args.evaluation, args.config, args.launch)
            return 0
        if args.command == "_zygote":
            from expctl.sweep import pool

            return pool.zygote_main()
        _parser().print_help()
        return 0
    except UserError as e:
        if _speaks(e, args.command):
            print(f"expctl: error: {e}", file=sys.stderr)
        return EXIT_USER
    except BrokenPipeError:  # `expctl list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Reported as e:  # local workers printed it
        return e.code
    except RunError as e:  # disk full, a hung peer: one line, no traceback
        if _speaks(e, args.command):
            print(f"expctl: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Preempted as e:
        if args.command != "_worker":  # the launching process speaks for its workers
            print(f"expctl: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt as e:
        if args.command != "_worker":  # the launching process speaks for its workers
            # (without `resume`: before a run directory was chosen, nothing to resume)
            how = (
                f"; to resume from the last checkpoint: {e.resume}"
                if isinstance(e, Interrupted)
                else ""
            )
            print(f"expctl: interrupted{how}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _speaks(e: UserError | RunError, command: str) -> bool:
    """Whether this process prints `e`: the rank that met it first (see rank.main), or where
    no rank was chosen (an error of every rank before they met) rank 0 of local workers."""
    if e.quiet is not None:
        return not e.quiet
    return command != "_worker" or os.environ.get("RANK", "0") == "0"


def _run(args: argparse.Namespace) -> int:
    if args.multirun:
        from expctl.startup import ending
        from expctl.sweep.pool import Pool

        # the local trials' zygote first: it imports torch while this process imports the
        # sweep's modules (Hydra, OmegaConf) and composes the points (on Slurm it is closed)
        pool = Pool()
        from expctl.sweep import multirun as sweep

        outcome = sweep.multirun(args.config, args.overrides, repeat=args.repeat, pool=pool)
        ending()
        return EXIT_FAILED if outcome.failed else 0  # it printed "N of M trial(s) failed: ..."
    if args.repeat:
        raise UserError(
            "--repeat needs -m (a sweep)", "add -m, e.g. expctl run -m --repeat 3 optim.lr=0.01,0.1"
        )
    from expctl.startup import paused_gc, process_is_the_run

    process_is_the_run()
    with paused_gc():
        from expctl import api  # torch
    result = api.run(args.config, args.overrides, wait=args.wait)
    if result.metrics and _is_main():  # under torchrun / srun: rank 0 reports
        print(f"expctl: done  {_shown(result.metrics)}\nexpctl: results in {result.run_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from expctl import api
    from expctl.layout import RunDir

    record = api.evaluate(args.run_dir, args.split, args.which, args.overrides, args.name)
    if _is_main():
        metrics = {k: v for k, v in record.items() if "/" in k}
        where = RunDir(args.run_dir).eval_result(record["name"])
        print(f"expctl: {record['split']} of step {record['step']}  {_shown(metrics)}")
        print(f"expctl: results in {where}")
    return 0


def _is_main() -> bool:
    from expctl.dist import detect

    return detect(os.environ).is_main


def _shown(metrics: dict[str, object]) -> str:
    return "  ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
    )


def _no_overrides(action: str, extra: list[str]) -> UserError:
    hint = "for other values, start a new sweep: `expctl run -C CONFIG -m KEY=VALUES`"
    if action == "resume":
        hint = "--skip-failed leaves failed trials as they are; " + hint
    return UserError(
        f"`expctl sweep {action}` takes no overrides (got {' '.join(extra)}): a sweep's trials "
        "keep the configuration they started with",
        hint,
    )


def _sweep(args: argparse.Namespace) -> int:
    options = {o: "table" for o in ("--json", "--csv", "--sort", "--filter")}
    options["--skip-failed"] = "resume"
    for option, action in options.items():
        if getattr(args, option[2:].replace("-", "_")) and args.action != action:
            raise UserError(
                f"{option} applies to `expctl sweep {action}` only, not `sweep {args.action}`",
                f"expctl sweep {action} {option} ... {args.sweep_dir}",
            )
    if args.action == "table":  # reads files only: no torch (pyproject's contracts)
        from expctl.sweep import results

        if args.json:
            print(results.to_json(results.load(args.sweep_dir).select(args.sort, args.filter)))
        elif args.csv:
            res = results.load(args.sweep_dir).select(args.sort, args.filter)
            print(results.to_csv(res), end="")
        else:
            print(results.table(args.sweep_dir, args.sort, args.filter))
    elif args.action == "best":
        from expctl.sweep.best import best

        print(best(args.sweep_dir).describe())
    elif args.action == "plot":
        from expctl.sweep import plots

        print(plots.plot(args.sweep_dir).describe())
    else:
        from expctl.startup import ending
        from expctl.sweep.resume import resume

        outcome = resume(args.sweep_dir, skip_failed=args.skip_failed)
        ending()
        return EXIT_FAILED if outcome.failed else 0
    return 0


def _runs(args: argparse.Namespace) -> int:
    from expctl import tables
    from expctl.inspect import compare

    wanted = [c.strip() for c in (args.columns or "").split(",") if c.strip()]
    if args.json or args.csv:
        res = compare.load(args.roots).select(args.sort, args.filter)
        picked = res.pick(wanted) if wanted else None
        if args.json:
            print(tables.to_json(res.to_dict(picked)))
        else:
            print(tables.to_csv(res.records(picked), picked or res.columns()), end="")
    else:
        print(compare.table(args.roots, args.sort, args.filter, wanted))
    return 0


def _show(args: argparse.Namespace) -> int:
    from expctl.builtin import catalogue
    from expctl.config import kept
    from expctl.dist import detect
    from expctl.startup import paused_gc

    notes: list[str] = []
    # the components' signatures without torch; until they are described (once per install,
    # in the background), composing imports them itself: sooner than the description, which
    # loads torchvision too
    catalogue.describe(wait=False)
    with paused_gc():  # a component's pre-flight check may load torch (datasets but MNIST's)
        cfg, text = kept.compose(args.config, args.overrides, notes=notes)
    env = detect(os.environ)
    out = [text, "# environment: " + ", ".join(f"{k}={v}" for k, v in vars(env).items()) + "\n"]
    if cfg.launcher.name == "local" and env.world_size == 1:  # this process's is not the run's
        n = cfg.launcher.nproc
        out[1] = (
            f"# environment: launcher=local starts {n} rank(s) on this machine (world_size={n})\n"
        )
    if cfg.launcher.name == "slurm":  # rendered before anything is printed: it may refuse
        from pathlib import Path

        from expctl.jobs import slurm
        from expctl.rank import rundir

        run_dir = rundir.deterministic_dir(cfg, None)
        if run_dir is None:
            run_dir = Path(cfg.run.root).absolute() / f"{cfg.run.name}-YYYYmmdd-HHMMSS-XXXX"
        out += [f"# sbatch script, for run directory {run_dir}:\n", slurm.render(cfg, run_dir)]
    for note in notes:
        print(f"expctl: note: {note}", file=sys.stderr)
    print("".join(out), end="")
    return 0


def _list(args: argparse.Namespace) -> int:
    from expctl import registry
    from expctl.builtin import catalogue

    catalogue.describe()  # expctl's own without torch; --import modules and plugins on top
    registry.import_user_modules(args.imports)
    kinds = [registry.canonical_kind(args.kind)] if args.kind else list(registry.KINDS)
    print(catalogue.listing(kinds), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
