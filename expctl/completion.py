"""Shell completion and the config groups `expctl run --help` lists: group options come from
composition (every registered name and preset), keys from the schema and each component.

Both read the registered components as `catalogue.py` describes them (no torch). Until that
description exists (the first minutes after installing), they offer what needs none: the
launchers, the presets and the fixed sections' keys. The completion script asks `expctl _words`
for its words when the shell first completes a KEY=VALUE word, so it never goes stale.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

from expctl import registry
from expctl.config import confstore, explain, schema
from expctl.config.layers import GROUPS, LOGGER, PRESETS, group_options
from expctl.errors import UserError
from expctl.registry import KINDS, names

PENDING = (
    "(their names are being described in the background, once for this installation: "
    "this help lists them in a few seconds; `expctl list` waits for them)"
)


def _needs_registry(group: str) -> bool:
    return group not in ("launcher", PRESETS)


def groups_text(config_file: str | None = None, described: bool = True) -> str:
    """Every config group and its options, as a Hydra app's --help lists them (`described`:
    the registered components are known without importing them; else only the other groups)."""
    dirs = [Path(config_file).expanduser().resolve().parent] if config_file else []
    lines = ["config groups (GROUP=NAME picks one; GROUP.KEY=VALUE sets its keys):"]
    pending = [g for g in GROUPS if _needs_registry(g)] if not described else []
    for group in (*GROUPS, PRESETS):
        if group in pending:
            continue
        options = group_options(group, dirs)
        text = f"{group} ({len(options)}): {', '.join(options)}"
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    if pending:
        text = f"{', '.join(pending)}: {PENDING}"
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    sections = ", ".join(schema.FIXED) + ", imports, env"
    lines.append(f"sections with fixed keys: {sections} (`expctl show` prints every key)")
    return "\n".join(lines)


def completion_words(described: bool = True) -> list[str]:
    """What the shell completes on the command line: GROUP=NAME and SECTION.KEY= words, the
    steps (train.step=NAME) and loggers (logger=NAME, logger.NAME.KEY=); `described`: as in
    `groups_text`."""
    groups = [g for g in (*GROUPS, PRESETS) if described or not _needs_registry(g)]
    words = [f"{group}={name}" for group in groups for name in group_options(group)]
    for section, cls in (*schema.FIXED.items(), ("launcher", schema.LauncherConfig)):
        for f in dataclasses.fields(cls):
            words.append(f"{section}.{f.name}=")
            values = f.metadata.get("choices") or ((True, False) if f.type == "bool" else ())
            words += [f"{section}.{f.name}={_yaml(v)}" for v in values]
    if not described:
        return sorted(set(words))
    for section in schema.COMPONENT_KINDS:
        for name in group_options(section):
            words += [f"{section}.{k}=" for k in explain.component_keys(section, name)]
    words += [f"train.step={name}" for name in names("steps")]
    for name in names("loggers"):
        words += [f"{LOGGER}={name}", *(f"{LOGGER}.{name}.{k}=" for k in _logger_keys(name))]
    return sorted(set(words))


def _yaml(value: object) -> str:
    """A value as the command line writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _logger_keys(name: str) -> list[str]:
    return list(confstore.node_defaults(LOGGER, registry.get("loggers", name)))


# bash splits words at '=': complete the whole KEY=VALUE word from the line, then hand back
# only the part after the last '=' when '=' is a word break (it is by default). The words come
# from `expctl _words`, once per shell (again while it says they are not complete yet): asked
# before shtab's function runs, whose completers run in subshells that cannot keep them.
_BASH = """_expctl_overrides() {
  local line="${COMP_LINE:0:$COMP_POINT}" cur w
  cur="${line##*[[:space:]]}"
  for w in $(compgen -W "${_EXPCTL_WORDS:-${_EXPCTL_SOME_WORDS-}}" -- "$cur"); do
    if [[ "$COMP_WORDBREAKS" == *=* && "$cur" == *=* ]]; then echo "${w#"${cur%=*}="}"
    else echo "$w"; fi
  done
}
_expctl_kinds() { compgen -W "@KINDS@" -- "$1"; }"""
_BASH_ENTRY = """
_expctl_complete() {
  if [[ -z "${_EXPCTL_WORDS-}" ]]; then
    local w
    w=$(@COMMAND@ _words 2>/dev/null) && _EXPCTL_WORDS=$w || _EXPCTL_SOME_WORDS=$w
  fi
  _shtab_expctl "$@"
}
complete -o bashdefault -F _expctl_complete expctl
"""
_ZSH = """_expctl_overrides() {
  if [[ -z "${_EXPCTL_WORDS-}" ]]; then
    local w
    w=$(@COMMAND@ _words 2>/dev/null) && typeset -g _EXPCTL_WORDS=$w
    [[ -n "${_EXPCTL_WORDS-}" ]] || { compadd -S '' -- ${(f)w}; return; }
  fi
  compadd -S '' -- ${(f)_EXPCTL_WORDS}
}
_expctl_kinds() { compadd -- @KINDS@; }"""


def completion_script(parser: Any, shell: str) -> str:
    """A completion script for `shell`, generated by shtab from the argument parser, with the
    config groups, their options and every key for KEY=VALUE arguments (asked of this Python's
    expctl when first needed) and the kinds `expctl list` takes."""
    try:
        import shtab  # noqa: PLC0415 - shtab off `run --help` and `_words`
    except ImportError:
        raise UserError("shell completion needs shtab", "pip install shtab") from None
    command = f"{shlex.quote(sys.executable)} -m expctl"
    preamble = {
        sh: text.replace("@COMMAND@", command).replace("@KINDS@", " ".join(KINDS))
        for sh, text in (("bash", _BASH), ("zsh", _ZSH))
    }
    script = str(shtab.complete(parser, shell=shell, preamble=preamble))  # type: ignore[arg-type]
    return script + _BASH_ENTRY.replace("@COMMAND@", command) if shell == "bash" else script
