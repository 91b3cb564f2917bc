"""`python -m specbench`: compose the Hydra config, build target (+ drafter), decode, write results.json."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from specbench.config import register
from specbench.errors import UserError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("method", "model", "dataset", "logger", "parallel", "experiment")
_in_task = {"flag": False}


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_overrides(argv: list[str]) -> None:
    """Reject `method=foo` (and sweeps `method=a,foo`) with one line listing the valid choices."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if key in ("method.acceptance", "method.typical") or key.startswith("method.typical."):
            top = key.removeprefix("method.")
            raise UserError(f"{key}: {top.split('.')[0]} is a top-level setting: {top}={value}")
        if not sep or key not in GROUPS:
            continue
        valid = group_options(key)
        for v in value.split(","):
            if v and v != "null" and v not in valid:
                raise UserError(f"{key}={v!r} is not a known {key}; valid: {', '.join(valid)}")


def _task(cfg: DictConfig) -> None:
    _in_task["flag"] = True
    try:
        from specbench.run import run

        run(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        _leave_together()
        sys.exit(2)


def _leave_together() -> None:
    """Under torchrun every rank raised the same error (checks are agreed on): wait until all have printed it,
    then exit 2 at once. torchrun stops the other ranks as soon as one has exited; a rank stopped that way
    after it reported the error still exits 2 (its SIGTERM handler), so every rank's status is the error's."""
    import os
    import signal

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    signal.signal(signal.SIGTERM, lambda *_: os._exit(2))
    from specbench.parallel import leave

    leave(2)


def _leave_after_success() -> None:
    """Under torchrun, once every job has run: all ranks leave the group together and exit 0 (see
    `parallel.leave` for why the interpreter's teardown is skipped)."""
    import torch.distributed as dist

    if dist.is_initialized():
        from specbench.parallel import leave

        leave(0)


def _rank_argv(argv: list[str]) -> list[str]:
    """Under torchrun only rank 0 writes the run folder: the other ranks' Hydra folders go to a temp dir."""
    import os
    import tempfile

    rank = os.environ.get("RANK", "0")
    if rank == "0":
        return argv
    tmp = Path(tempfile.gettempdir()) / f"specbench-rank{rank}-{os.getpid()}"
    keep = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "hydra.output_subdir="))]
    return keep + [f"hydra.run.dir={tmp}", f"hydra.sweep.dir={tmp}", "hydra.output_subdir=null"]


def main() -> None:
    register()
    sys.argv[1:] = _rank_argv(sys.argv[1:])
    try:
        check_group_overrides(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_task)
    try:
        app()
        _leave_after_success()
    except SystemExit as e:
        # Hydra exits 1 on a config it cannot compose (bad override, wrong type): that is bad input too
        if e.code == 1 and not _in_task["flag"]:
            sys.exit(2)
        raise
