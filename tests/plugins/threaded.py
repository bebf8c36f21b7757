"""Test plugin (listed under `imports:`): a module that starts a thread when imported (as a
notebook's kernel has threads), and a step that writes its process's parent's command line to
$PARENT_FILE: how a sweep's trials were started when a fork was not safe."""

from __future__ import annotations

import os
import threading
import time

from expctl import register
from expctl.builtin.steps import Supervised

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


@register("steps", "parent_cmdline")
class ParentCmdline(Supervised):
    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
        with open(os.environ["PARENT_FILE"], "ab") as out:
            out.write(cmdline + b"\n")
        return super().train_step(ctx, batch)
