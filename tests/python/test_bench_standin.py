"""The all_reduce stand-in of tunedist.bench (tunedist.bench.standin): the peers-only design run on shared memory,
whose time the bench sets beside the largest all_reduce. Checked for real under torchrun at 2 and 3 ranks: results
at counts that do not split evenly (including parts of zero elements), four dtypes, both copiers, and that it
leaves no name in /dev/shm and no mapping behind. No timing is asserted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 300


@pytest.mark.parametrize("world_size", [2, 3])
def test_standin_is_right_at_every_count_and_leaves_nothing(world_size):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
           str(HERE / "standin_worker.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert proc.stdout.count(" ok") == 20 and "OK" in proc.stdout, proc.stdout[-4000:]  # 4 dtypes x 5 counts
