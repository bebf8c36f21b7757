"""One sweep trial in its own process: `trial_main`, what the pool's zygote runs for each trial
(pool.py's TRIAL_MAIN), trains its frozen config and returns the CLI's exit code, its errors
printed to TRIAL_DIR/output.log as the CLI prints them; trials.py's driver reads how it ended.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from expctl.config import frozen as config_mod
from expctl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_USER,
    OutOfMemory,
    Preempted,
    RunError,
    UserError,
)
from expctl.jobs.study import SHARE_ENV, failure_text
from expctl.rank.provenance import Launch
from expctl.startup import process_is_the_run

HEADER = "expctl: sweep trial"  # the first line of a trial's output.log (its share)


def trial_main(argv: Sequence[str]) -> int:
    """One trial in its process (started by the pool): train its frozen config and return the
    CLI's exit code; errors are printed to its output as the CLI prints them."""
    request = json.loads(argv[0])
    process_is_the_run()
    print(f"{HEADER} {request['where']}".rstrip(), flush=True)
    try:
        from expctl.jobs import launch  # noqa: PLC0415 - torch: a trial's, never its driver's
        from expctl.jobs.exploit import continue_as_copy  # noqa: PLC0415 - the same (checkpoints)

        cfg = config_mod.load(request["run_dir"])
        origin = Launch.from_json(Path(request["launch"]).read_text())
        launch.launch(cfg, origin=origin)
        copy = continue_as_copy(cfg)
        while copy is not None:  # PBT: continue as a copy of a better trial
            launch.launch(copy, origin=origin)
            copy = continue_as_copy(copy)
        return 0
    except UserError as e:
        print(f"expctl: error: {e}", file=sys.stderr)
        return EXIT_USER
    except RunError as e:  # out of memory on a shared GPU: the setting that packed it there
        print(
            f"expctl: error: {failure_text(e) if isinstance(e, OutOfMemory) else e}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except Preempted as e:  # its run's "run the same command" is the sweep's resume here
        stopped = str(e).split("; checkpoint saved")[0]
        sweep = Path(request["run_dir"]).parent
        print(f"expctl: {stopped}: `expctl sweep resume {sweep}` continues it", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:
        if os.environ.get(SHARE_ENV) and type(e).__name__ == "OutOfMemoryError":
            print(f"expctl: error: {failure_text(e)}", file=sys.stderr)  # the ledger says it too
            return EXIT_FAILED
        raise
