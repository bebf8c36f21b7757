"""The exceptions of expctl and the exit codes they end in (importable without torch), and
did-you-mean helpers.

Exit codes, shared with the sbatch templates in slurm/ (`EXIT_USER=2 EXIT_PREEMPTED=3` there):
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

EXIT_FAILED = 1  # RunError: one line, no traceback; what was checkpointed is kept
EXIT_USER = 2  # UserError: a mistake the user fixes; nothing half-written on disk
EXIT_PREEMPTED = 3  # Preempted: stopped by the signal at a checkpoint; the same command resumes
EXIT_TERMINATED = 143  # Preempted by SIGTERM (128 + 15, as a shell reports a process it ended)
EXIT_INTERRUPTED = 130  # Ctrl-C


class UserError(Exception):
    """A mistake the user can fix: printed in one or two lines, exit code 2, no traceback.

    Args:
        message: what is wrong, naming the bad value.
        hint: the exact fix, printed on a second line after ``HINT:``.
    """

    quiet: bool | None = None  # True: another rank prints it; None: rank 0 does

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        message, hint = one_line(self.message), one_line(self.hint or "")
        return message if not hint else f"{message}\n  HINT: {hint}"


# C0/C1 controls and Unicode line breaks: what would split a message, a file name or a script line
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with every control character escaped as repr writes it (a newline as \\n, NUL as
    \\x00): a value quoted in an error never splits the message's one line."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    options = [str(c) for c in choices]
    same = [c for c in options if c.lower() == str(value).lower() and c != str(value)]
    if same:  # `optim=SGD`
        return f" Did you mean '{same[0]}'?"
    lowered = {c.lower(): c for c in options}
    close = difflib.get_close_matches(str(value).lower(), list(lowered), n=1, cutoff=0.6)
    return f" Did you mean '{lowered[close[0]]}'?" if close else ""


def choices_text(choices: Iterable[str], limit: int = 12) -> str:
    """Render valid choices as 'a, b, c' (shortened to `limit` names, with a count of the rest)."""
    names = sorted(choices)
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f", ... ({len(names) - limit} more)"


def unknown_name(kind: str, name: str, choices: Iterable[str], hint: str) -> UserError:
    """Build the error for a name that is not among `choices`."""
    choices = list(choices)
    return UserError(
        f"unknown {kind} '{name}'.{did_you_mean(name, choices)} Valid: {choices_text(choices)}",
        hint,
    )


class RunError(RuntimeError):
    """A run stopped for a reason outside the program (a full disk, a hung or dead peer).

    The CLI prints it in one line without a traceback and exits 1; what was checkpointed is kept.
    """

    quiet: bool | None = None  # True: another rank (or the launcher) prints it; None: rank 0 does


class Reported(RunError):
    """A failure of local workers that they printed themselves: the launcher exits with `code`
    and prints nothing more (a sweep records the trial as failed with this message)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class OutOfMemory(RunError):
    """A rank ran out of GPU memory (torch's OutOfMemoryError is its cause): one line saying
    what torch tried to allocate and what to change."""


class CheckpointError(RunError):
    """A checkpoint could not be written (disk full, permissions); the previous one is intact."""


class Preempted(Exception):
    """Training stopped at a checkpoint because the stop signal arrived (resumable); `code` is
    the exit code (EXIT_PREEMPTED, or EXIT_TERMINATED for SIGTERM)."""

    def __init__(self, message: str, code: int = EXIT_PREEMPTED) -> None:
        super().__init__(message)
        self.code = code


class Terminated(KeyboardInterrupt):
    """SIGTERM to `expctl run` before training (or torch's elastic agent) took the signal over,
    raised where the process was, as Ctrl-C raises KeyboardInterrupt (`startup.sigterm_raises`):
    the run says where it is and exits EXIT_TERMINATED, not ended silently by the default."""

    code = EXIT_TERMINATED


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or another signal that stops), with how to resume what was interrupted
    (`resume`: what to run), the exit code (128 + the signal), and whether a checkpoint was
    saved (`saved`; without one, `resume` starts over)."""

    def __init__(self, resume: str, code: int = EXIT_INTERRUPTED, saved: bool = True) -> None:
        super().__init__(resume)
        self.resume = resume
        self.code = code
        self.saved = saved
