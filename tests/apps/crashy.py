"""An agent whose step kills its own worker process every time it runs (a segfault, an OOM)."""

from __future__ import annotations

import os
import signal

from sojourn.actors import Context, agent, current_step


def explode() -> int:
    path = os.environ.get("SOJOURN_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"exec {current_step().attempt}\n")
            f.flush()
            os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


@agent("crashy")
async def crashy(ctx: Context, _: None) -> int:
    return await ctx.step(explode) + 1
