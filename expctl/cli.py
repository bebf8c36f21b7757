"""The ``expctl`` command. Parsing imports nothing heavy: each command imports its modules inside
its branch (lazy, for speed: `expctl --help` loads neither torch nor Hydra)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from expctl import arguments
from expctl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USER,
    Interrupted,
    Preempted,
    Reported,
    RunError,
    Terminated,
    UserError,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = arguments.parser()
    try:
        args, extra = parser.parse_known_args(argv)  # --help prints here
    except BrokenPipeError:  # `expctl run --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    # overrides may come before and after options (`run x=1 -C f.yml y=2`); argparse splits them
    stray = [a for a in extra if a.startswith("-")]
    if args.command == "sweep" and extra and not stray and args.action != "resume":
        print(f"expctl: error: {_no_overrides(args.action, extra)}", file=sys.stderr)
        return EXIT_USER
    if args.command == "sweep":  # `sweep resume DIR sweep.max_concurrent=4`: resume.py checks
        args.overrides, extra = [] if stray else extra, stray
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

            print(completion.completion_script(arguments.parser(), args.shell))
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
        arguments.parser().print_help()
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
    except Terminated as e:  # SIGTERM before a run directory was made (after: Preempted)
        print("expctl: stopped by SIGTERM", file=sys.stderr)
        return e.code
    except KeyboardInterrupt as e:
        if args.command != "_worker":  # the launching process speaks for its workers
            # (without `resume`: before a run directory was chosen, nothing to resume)
            how = ""
            if isinstance(e, Interrupted) and e.saved:
                how = f"; to resume from the last checkpoint: {e.resume}"
            elif isinstance(e, Interrupted):
                how = f" before its first checkpoint, nothing to resume: {e.resume} to start over"
            print(f"expctl: interrupted{how}", file=sys.stderr)
        return e.code if isinstance(e, Interrupted) else EXIT_INTERRUPTED


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
    from expctl.startup import paused_gc, process_is_the_run, sigterm_raises

    process_is_the_run()
    with sigterm_raises():
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
    return UserError(
        f"`expctl sweep {action}` takes no overrides (got {' '.join(extra)})",
        "the sweep's settings of how its trials run may change on `expctl sweep resume DIR "
        "KEY=VALUE`; for other values, start a new sweep",
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

        outcome = resume(args.sweep_dir, args.overrides, skip_failed=args.skip_failed)
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
