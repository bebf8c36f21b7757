"""Tables of flat records (one dict per row), as `expctl sweep table` and `expctl runs` show them.

Filters (``--filter KEY=VALUE``, ``KEY!=VALUE`` and, on numbers, ``KEY>X``, ``>=``, ``<``,
``<=``), sorting (``--sort KEY``, ``--sort=-KEY`` for descending, missing values last), cells
as CSV or filter text, CSV, a pandas DataFrame, and a text table fitted to the terminal's width.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import math
import operator
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from expctl.errors import UserError, choices_text, did_you_mean, unknown_name

# two-character operators first: `a>=1` is `>=`, not `>` with the value `=1`
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
WIDEST_CELL = 32  # longer cells are cut in the middle (…) in the text table; CSV and JSON keep them


@dataclass(frozen=True)
class Filter:
    """One ``--filter``: a column, an operator (=, !=, >, >=, <, <=) and the text after it."""

    key: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Filter:
        """Raises UserError: no operator, or a comparison with something other than a number."""
        at = next((i for i, c in enumerate(text) if c in "<>=!"), len(text))
        op = next((o for o in ("!=", *COMPARISONS, "=") if text[at:].startswith(o)), "")
        if not op:
            raise UserError(
                f"--filter {text!r}: expected KEY=VALUE (or KEY!=, >, >=, <, <= VALUE)",
                "e.g. --filter status=failed --filter 'val/acc>0.9'",
            )
        found = cls(text[:at], op, text[at + len(op) :])
        if op in COMPARISONS and _number(found.value) is None:
            raise UserError(
                f"--filter {text!r}: {op} compares numbers, not {found.value!r}",
                f"e.g. --filter '{found.key}{op}0.5'",
            )
        return found

    def passes(self, value: Any) -> bool:
        if self.op == "=":
            return matches(value, self.value)
        if self.op == "!=":
            return not matches(value, self.value)
        number, limit = _number(value), _number(self.value)
        return number is not None and limit is not None and COMPARISONS[self.op](number, limit)


def select(
    records: Sequence[Mapping[str, Any]],
    sort: str | None,
    filters: Sequence[str],
    columns: Sequence[str],
    listing: str,
    choices: Mapping[str, Sequence[str]] | None = None,
) -> list[int]:
    """The indices of the records that pass every filter (equality filters of one key: any of
    their values), ordered by column `sort` (``-KEY``: descending; None: as given).

    Args:
        columns: the keys a filter or sort may name.
        listing: the command that prints those columns, for the HINT of an unknown one.
        choices: the values some columns may hold (``status``), checked with a did-you-mean.

    Raises:
        UserError: an unknown column or value, or a filter without an operator.
    """
    parsed = [Filter.parse(text) for text in filters]
    for f in parsed:
        check_column(f.key, columns, "--filter", listing)
        allowed = (choices or {}).get(f.key)
        if allowed is not None and f.op in ("=", "!=") and f.value not in allowed:
            raise unknown_name(f.key, f.value, allowed, f"e.g. --filter {f.key}={allowed[0]}")
    equal: dict[str, list[Filter]] = {}
    for f in parsed:
        if f.op == "=":
            equal.setdefault(f.key, []).append(f)
    rest = [f for f in parsed if f.op != "="]
    keep = [
        i
        for i, rec in enumerate(records)
        if all(any(f.passes(rec.get(k)) for f in fs) for k, fs in equal.items())
        and all(f.passes(rec.get(f.key)) for f in rest)
    ]
    if sort is None:
        return keep
    key = sort.removeprefix("-")
    check_column(key, columns, "--sort", listing)
    present = [i for i in keep if records[i].get(key) is not None]
    present.sort(key=lambda i: _order(records[i][key]), reverse=sort.startswith("-"))
    return present + [i for i in keep if records[i].get(key) is None]


def pick(columns: Sequence[str], patterns: Sequence[str], option: str, listing: str) -> list[str]:
    """The columns that `patterns` name (names, or shell-style globs: `optim.*`, `val/*`), in
    the order of the patterns, each once.

    Raises:
        UserError: a pattern that names no column (with a did-you-mean).
    """
    out: dict[str, None] = {}
    for pattern in patterns:
        hits = [c for c in columns if fnmatch.fnmatchcase(c, pattern)]
        if not hits:
            check_column(pattern, columns, option, listing)
        out.update(dict.fromkeys(hits))
    return list(out)


def check_column(key: str, columns: Sequence[str], option: str, listing: str) -> None:
    if key not in columns:
        raise UserError(
            f"{option} {key}: no such column.{did_you_mean(key, columns)} Valid: "
            f"{choices_text(columns, limit=20)}",
            f"the columns are those of `{listing}`",
        )


def cell(v: Any) -> Any:
    """A value as one CSV cell or filter text: lists and mappings in JSON (`[32,32]`)."""
    return json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else v


def finite(v: float | None) -> float | None:
    """NaN and infinity as None: JSON has no spelling for them (a diverged run's loss)."""
    return v if v is None or math.isfinite(v) else None


def matches(value: Any, text: str) -> bool:
    """Whether a cell's value is what a filter's text spells (numbers compared as numbers)."""
    if value is None:
        return text in ("", "null", "None", "-")
    if is_number(value):
        return _number(text) == float(value)
    return str(cell(value)).lower() == text.lower()


def is_number(v: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _order(v: Any) -> tuple[int, Any]:
    """Numbers before text; each in its own order (a column mixes them rarely)."""
    if isinstance(v, (int, float)):
        return (0, float(v))
    return (1, str(cell(v)))


def to_json(data: Mapping[str, Any]) -> str:
    """A table's JSON form, indented (its floats finite: see `finite`)."""
    return json.dumps(data, indent=2, allow_nan=False)


def to_csv(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """One row per record under a header of `columns`; lists and mappings as JSON cells."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow({k: "" if v is None else cell(v) for k, v in rec.items() if k in columns})
    return out.getvalue()


def to_pandas(records: Sequence[Mapping[str, Any]], index: str, what: str) -> Any:
    """The records as a pandas DataFrame indexed by column `index`.

    Raises:
        UserError: pandas is not installed (`what` names the method asked).
    """
    try:
        import pandas  # noqa: PLC0415 - optional (expctl[pandas]), and heavy
    except ImportError:
        raise UserError(
            f"{what} needs pandas, which is not installed",
            "pip install pandas (or use .records(): a list of dicts)",
        ) from None
    return pandas.DataFrame.from_records(list(records)).set_index(index)


def shown(v: Any) -> str:
    """A value as the text table shows it: floats to 4 significant digits, None as `-`."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(cell(v))


def text(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int | None = None,
    indent: str = "",
) -> list[str]:
    """Aligned lines (numbers to the right), each after `indent`, cells cut to 32 characters;
    the columns that do not fit in `width` (default: the terminal's) are left out, and a last
    line says which."""
    width = (width or shutil.get_terminal_size((120, 24)).columns) - len(indent)
    cut = [[_cut(c) for c in row] for row in rows]
    sizes = [max([len(h), *(len(r[i]) for r in cut)]) for i, h in enumerate(columns)]
    fits, used = 0, -2
    while fits < len(columns) and (fits == 0 or used + 2 + sizes[fits] <= width):
        used, fits = used + 2 + sizes[fits], fits + 1
    right = [all(_number(r[i]) is not None or r[i] == "-" for r in cut) for i in range(fits)]

    def line(cells: Sequence[str]) -> str:
        return (
            indent
            + "  ".join(
                c.rjust(sizes[i]) if right[i] else c.ljust(sizes[i])
                for i, c in enumerate(cells[:fits])
            ).rstrip()
        )

    lines = [line(columns), *(line(r) for r in cut)]
    if fits < len(columns):
        lines.append(
            f"(not shown, too wide: {', '.join(columns[fits:])}; --csv or --json show all)"
        )
    return lines


def _cut(c: str) -> str:
    """A long cell's start and end (a run's name differs at its end: `sweep-…/trial_003`)."""
    if len(c) <= WIDEST_CELL:
        return c
    head = (WIDEST_CELL - 1) // 3
    return c[:head] + "…" + c[head + 1 - WIDEST_CELL :]
