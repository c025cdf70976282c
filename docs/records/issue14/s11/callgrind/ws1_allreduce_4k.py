import sys

import torch
import torch.distributed as dist

import tunedist

dist.init_process_group("tuned", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(1024)
for _ in range(100):
    dist.all_reduce(t)
for _ in range(int(sys.argv[1])):
    dist.all_reduce(t)
print(tunedist.__file__)
dist.destroy_process_group()
