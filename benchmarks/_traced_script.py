"""Run a script under torchrun with the workbench's script tracing around it, as a workbench rank
does (``workbench.rank.script``) but launched by torchrun itself, so that the benchmark compares
traced and untraced runs of the same script under the same launcher.

    torchrun --standalone --nproc-per-node 2 benchmarks/_traced_script.py TRACES SCRIPT ARGS...
"""

import os
import runpy
import sys
from pathlib import Path

import torch

from workbench.trace.torch_hooks import ScriptHooks
from workbench.trace.tracer import Tracer


def main() -> None:
    traces, script, *args = sys.argv[1:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    Path(traces).mkdir(parents=True, exist_ok=True)
    with Tracer(
        Path(traces),
        run_id="bench",
        rank=rank,
        local_rank=int(os.environ["LOCAL_RANK"]),
        host="bench",
        world_size=world,
        attempt=0,
        flush_s=2.0,
        device=torch.device("cpu"),
        stop_on_nonfinite=False,
    ) as tracer:
        hooks = ScriptHooks(
            tracer,
            script=script,
            rank=rank,
            world_size=world,
            warmup_steps=2,
            comm_every_steps=50,
            collective_timeout_s=120,
        ).install()
        sys.argv = [script, *args]
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            hooks.close()


if __name__ == "__main__":
    main()
