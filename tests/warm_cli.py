"""A warm start for the suite's CLI processes: one server per pytest worker imports torch, Hydra
and expctl once, then forks a child for each `expctl ...` a test runs.

The child is a real process with the test's working directory, environment, argv and module
search path (``python -m`` puts the working directory first, then PYTHONPATH), its own stdout
and stderr, and its own exit code; only the interpreter's start-up (about 3.5 s of imports on the
2-core CI machine) is shared. Tests whose subject is that start-up (what `--help` imports, which
module a name resolves to) start a fresh interpreter instead (`conftest.expctl(..., fresh=True)`).

Protocol on stdin/stdout, one JSON object a line: the request
``{"argv": [...], "cwd": ..., "env": {...}, "out": PATH, "err": PATH}`` is answered with
``{"pid": N}`` when the child starts and ``{"code": C}`` when it ends (C < 0: killed by signal -C).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile


def _child(req: dict[str, object]) -> None:
    """In the forked child: become `python -m expctl ARGV` in the test's cwd and environment."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills it with its workers
        fd_in = os.open(os.devnull, os.O_RDONLY)
        fd_out = os.open(str(req["out"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fd_err = os.open(str(req["err"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(req["cwd"]))
        env = dict(req["env"])  # type: ignore[call-overload]
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # found again from this environment's TMPDIR, as a new process
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *SITE]
        sys.argv = ["expctl", *req["argv"]]  # type: ignore[misc]
        from expctl import cli

        code = cli.main(sys.argv[1:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    SITE = [p for p in sys.path[1:]]  # the interpreter's own entries, without this folder
    # what every expctl process imports, once (nothing of it reads the environment of a test)
    import hydra  # noqa: F401
    import omegaconf  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  # torch.optim imports it on first use: 2 s here
    import torch.distributed  # noqa: F401

    import expctl.cli  # noqa: F401
    import expctl.config.compose  # noqa: F401
    import expctl.jobs.launch  # noqa: F401
    import expctl.sweep.multirun  # noqa: F401
    import expctl.sweep.resume  # noqa: F401
    from expctl import registry

    registry.load_builtins()
    # Hydra's first composition builds its grammar and config repository (~2 s here); every
    # child composes again from its own files and arguments, as in-process tests do
    expctl.config.compose.compose(None, [])
    serve()
