"""Run a command and print each line of its output with the seconds since launch: where start-up
time goes (torch's elastic agent logs its phases with LOGLEVEL=INFO).

    LOGLEVEL=INFO python bench/timestamps.py expctl run launcher=local launcher.nproc=2 ...
"""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", bufsize=1,
        )  # fmt: skip
    except OSError as e:  # no such command, not executable
        print(f"timestamps.py: cannot run {sys.argv[1]!r}: {e.strerror}", file=sys.stderr)
        return 127
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"{time.perf_counter() - t0:7.2f}  {line.rstrip()}", flush=True)
    code = proc.wait()
    print(f"{time.perf_counter() - t0:7.2f}  exit {code}", flush=True)
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main())
