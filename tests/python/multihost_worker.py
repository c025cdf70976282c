"""One rank of the multi-host tests that run under torchrun (two torchruns = two hosts, or one per namespace).

Runs every collective against closed-form values, DDP against gloo and the gloo byte count of a 4 MiB all_reduce,
then writes ``<MULTIHOST_RESULT_DIR>/rank<RANK>.json``. A failure is written there too (with its traceback), and
the process exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist

import multihost_checks as mc
import tunedist  # noqa: F401


def main() -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = Path(os.environ["MULTIHOST_RESULT_DIR"]) / f"rank{rank}.json"
    torch.set_num_threads(1)
    result: dict = {"rank": rank, "host_id": os.environ.get("TUNEDIST_HOST_ID", "")}
    try:
        dist.init_process_group("tuned", timeout=timedelta(seconds=float(os.environ.get("MULTIHOST_PG_TIMEOUT", 60))))
        n = 1 << 20
        result["gloo_bytes_4MiB"] = mc.gloo_bytes_of_all_reduce(n)
        if os.environ.get("MULTIHOST_CHECKS", "all") == "all":
            result.update(mc.run_all(rank, world))
            result["ddp_max_diff"] = mc.ddp_matches_gloo(rank, world)
        else:  # "all_reduce": the hot path only
            mc.check_all_reduce(rank, world)
            result["hosts"] = mc.host_layout()
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the test
        result["ok"] = False
        result["traceback"] = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    out.write_text(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
