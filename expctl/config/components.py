"""A config's components checked against the registries: every component's name and
arguments (its factory's signature, its pre-flight check), the steps, the loggers, what model
and data both take, and `train.hparam_schedule`'s entries. Called by `validate.py`, which checks
the rest (types, ranges, cross-section checks)."""

from __future__ import annotations

from expctl import registry, signatures
from expctl.config.schema import COMPONENT_KINDS, HPARAM_SECTIONS, Config
from expctl.errors import UserError


def check_registered(cfg: Config) -> None:
    """Check every component name and argument against the registries."""
    registry.import_user_modules(cfg.imports)
    for section, kind in COMPONENT_KINDS.items():
        comp = getattr(cfg, section)
        if comp.name is None:
            continue
        signatures.check_args(kind, comp.name, comp.args, section)
    registry.get("steps", cfg.train.step)
    for i, entry in enumerate(cfg.train.hparam_schedule):
        for section in set(entry) & set(HPARAM_SECTIONS):
            comp = getattr(cfg, section)
            where = f"train.hparam_schedule[{i}].{section}"
            try:
                signatures.check_args(
                    COMPONENT_KINDS[section], comp.name, {**comp.args, **entry[section]}, where
                )
            except UserError as e:  # a component's check names its section: say which entry
                raise UserError(f"{where}: {e.message}", e.hint) from None
    for name, args in cfg.logger.items():
        signatures.check_args("loggers", name, args, f"logger.{name}")
    _check_shared(cfg)
    if cfg.sched.name is not None:
        steps_on_metric = "monitor" in registry.get("schedulers", cfg.sched.name).settings
        if steps_on_metric != (cfg.sched.monitor is not None):
            raise UserError(
                f"sched.monitor={cfg.sched.monitor}: sched={cfg.sched.name} "
                + ("steps on a metric and needs one" if steps_on_metric else "steps on no metric"),
                "set sched.monitor=val/loss (or another validation metric)"
                if steps_on_metric
                else "remove sched.monitor, or use sched=reducelronplateau",
            )


def _check_shared(cfg: Config) -> None:
    """An argument the model takes from the data when it is null (gpt's block_size and
    vocab_size) that the data's factory takes too, by name: set on the model, it must be the
    data's value, or the model would be built for other data.

    Raises:
        UserError: the two differ, naming both.
    """
    if cfg.model.name is None or cfg.data.name is None:
        return
    model, data = registry.get("models", cfg.model.name), registry.get("datasets", cfg.data.name)
    for key in sorted(model.inferred & set(data.parameters())):
        mine, theirs = cfg.model.args.get(key), cfg.data.args.get(key)
        if mine is None or mine == theirs:
            continue
        shown = "null (the data's own)" if theirs is None else theirs
        raise UserError(
            f"model.{key}={mine}, but data.{key} is {shown}: the model would be built for "
            "other data",
            f"leave model.{key} out (it is the data's), or set data.{key}={mine} as well",
        )


def check_hparam_schedule(cfg: Config) -> None:
    """train.hparam_schedule: entries of `step` (increasing) and optim / loss arguments, none of
    them a learning rate that a scheduler also sets.

    Raises:
        UserError: anything else, naming the entry.
    """
    last = -1
    for i, entry in enumerate(cfg.train.hparam_schedule):
        where = f"train.hparam_schedule[{i}]"
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step <= last:
            raise UserError(
                f"{where}: each entry needs a `step` (an integer, increasing): got {step!r}",
                "e.g. train.hparam_schedule=[{step: 0, optim: {lr: 0.1}}, {step: 400, optim: "
                "{lr: 0.01}}]",
            )
        last = step
        for key, values in entry.items():
            if key == "step":
                continue
            if key not in HPARAM_SECTIONS or not isinstance(values, dict) or "name" in values:
                raise UserError(
                    f"{where}.{key}: only optimizer and loss arguments can change mid-run "
                    f"(optim: {{...}}, loss: {{...}})",
                    "keep the component and the model as they are; change optim.* / loss.* "
                    "arguments only",
                )
        if "lr" in entry.get("optim", {}) and cfg.sched.name is not None:
            raise UserError(
                f"{where}.optim.lr: sched={cfg.sched.name} sets the learning rate too",
                "use sched=none with a learning-rate schedule of your own",
            )
