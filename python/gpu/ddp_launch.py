"""DDP over NCCL for three backward passes, printing whether xseg is the
rank's CUDA allocator: started as `torchrun --standalone --nproc-per-node N
-m xseg python/gpu/ddp_launch.py` it checks that every rank runs with xseg
(RESULTS round 25, r25m)."""
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).cuda())
for _ in range(3):
    m(torch.randn(8, 64, device="cuda")).sum().backward()
torch.cuda.synchronize()
print("RANK", rank, "xseg allocator:", "xseg.num_maps" in torch.cuda.memory_stats(), flush=True)
dist.destroy_process_group()
