"""A hand-written all-gather and halo exchange on CPU, written against torch's own symmetric-memory API.

    torchrun --standalone --nproc_per_node=2 examples/symm_mem_allgather.py

Nothing here is tunedist's API: with a `tuned` group, torch.distributed._symmetric_memory allocates from the group's
symmetric heap (shared memory every rank of the host maps), so get_buffer(peer, ...) is a CPU tensor over the peer's
memory, and put_signal / wait_signal / barrier order the ranks' loads and stores. The same code runs on CUDA with
NCCL or NVSHMEM symmetric memory.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import tunedist  # noqa: F401  (registers the CPU allocator; torchrun's entry point already registers `tuned`)


def all_gather(hdl, shard: torch.Tensor) -> torch.Tensor:
    """Every rank's `shard`, in rank order: each rank writes its shard into block `rank` of every peer's buffer
    (a store into the peer's memory), then one barrier makes all of them visible."""
    rank, world = hdl.rank, hdl.world_size
    n = shard.numel()
    for peer in range(world):
        hdl.get_buffer(peer, (world, n), shard.dtype)[rank].copy_(shard)
    hdl.barrier(channel=0)  # every block of every buffer is written
    out = hdl.get_buffer(rank, (world, n), shard.dtype).clone()
    hdl.barrier(channel=0)  # every rank has copied its result: the buffers may be written again
    return out


def halo_exchange(hdl, field: torch.Tensor, halo: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-D domain cut over the ranks in a ring: each rank puts its `halo` edge cells into its neighbours' buffers
    and signals each; it reads its own halos once both neighbours have signalled."""
    rank, world = hdl.rank, hdl.world_size
    left, right = (rank - 1) % world, (rank + 1) % world
    # Buffer layout on every rank: [halo from the left neighbour | halo from the right neighbour].
    hdl.get_buffer(right, (2, halo), field.dtype)[0].copy_(field[-halo:])  # our right edge is its left halo
    hdl.put_signal(right, channel=1)
    hdl.get_buffer(left, (2, halo), field.dtype)[1].copy_(field[:halo])  # our left edge is its right halo
    hdl.put_signal(left, channel=2)
    hdl.wait_signal(left, channel=1)
    hdl.wait_signal(right, channel=2)
    mine = hdl.get_buffer(rank, (2, halo), field.dtype)
    return mine[0].clone(), mine[1].clone()


def main() -> None:
    dist.init_process_group("tuned")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 4
    buf = symm_mem.empty(world * n, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(buf, dist.group.WORLD)

    gathered = all_gather(hdl, torch.full((n,), float(rank)))
    assert torch.equal(gathered, torch.arange(world, dtype=torch.float32).repeat_interleave(n).view(world, n))

    field = torch.arange(10, dtype=torch.float32) + 100 * rank
    from_left, from_right = halo_exchange(hdl, field, halo=2)
    left, right = (rank - 1) % world, (rank + 1) % world
    assert torch.equal(from_left, torch.tensor([8.0, 9.0]) + 100 * left)
    assert torch.equal(from_right, torch.tensor([0.0, 1.0]) + 100 * right)
    hdl.barrier()
    if rank == 0:
        print(f"all_gather over get_buffer: {gathered.tolist()}")
        print(f"halo exchange: rank 0 got {from_left.tolist()} from rank {left} and {from_right.tolist()} "
              f"from rank {right}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
