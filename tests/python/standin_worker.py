"""Worker of test_bench_standin.py, under torchrun on gloo: the all_reduce stand-in of tunedist.bench at awkward
counts and dtypes, checked; then that it left nothing behind. Prints one line per case and a final OK."""

import os
import sys

import torch
import torch.distributed as dist

from tunedist.bench.standin import AllreduceStandin, SharedRegions, StandinUnavailable

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)


def counts(world: int) -> tuple:
    """Parts of zero and of one element, a few elements per rank, a part of several check chunks, and sizes that do
    not split evenly."""
    return (1, world + 1, 34 * world, 1001, (1 << 21) + 3)


def mapped_standins() -> list:
    with open("/proc/self/maps") as f:
        return [line for line in f if "tunedist-standin" in line]


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shm_before = set(os.listdir("/dev/shm"))
    for dtype in DTYPES:
        for count in counts(world):
            standin = AllreduceStandin(count, dtype)
            wrong = standin.check()
            times = standin.time_us(reps=2)
            standin.close()
            assert wrong == 0, f"{dtype} {count}: {wrong} wrong elements"
            assert set(times) == {"torch copy", "streaming copy", "best"} and all(t > 0 for t in times.values())
            assert times["best"] == min(times["torch copy"], times["streaming copy"])
            if rank == 0:
                print(f"case {dtype} {count} ok", flush=True)
    # A region that cannot be made fails on every rank with one message naming the rank and the size (here: more
    # address space than any machine has), and leaves nothing behind either.
    try:
        SharedRegions(1 << 62)
    except StandinUnavailable as e:
        assert "tunedist.bench stand-in" in str(e) and f"{1 << 62} B of memfd" in str(e), e
    else:
        raise AssertionError("a region of 2^62 bytes was made")
    # Ranks that stand for different hosts (TUNEDIST_HOST_ID, as tuned groups read it) get no stand-in, on every rank.
    os.environ["TUNEDIST_HOST_ID"] = f"host{rank % 2}"
    try:
        SharedRegions(4096)
    except StandinUnavailable as e:
        assert "not on one host" in str(e), e
    else:
        raise AssertionError("ranks of two hosts made shared regions")
    del os.environ["TUNEDIST_HOST_ID"]
    # Nothing named in /dev/shm, and nothing mapped once closed: the regions are memfds, gone with their mappings.
    made = {n for n in set(os.listdir("/dev/shm")) - shm_before if "standin" in n}
    assert made == set(), made
    assert mapped_standins() == [], mapped_standins()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
