"""The README's Python example: run with `torchrun --nproc-per-node 4 torchrun_example.py`
(ranks sharing one GPU need an MPS server: `nvidia-cuda-mps-control -d`)."""
import torch, maco

comm = maco.Communicator()                  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR/PORT
torch.cuda.set_device(comm.device)
x = torch.full((1 << 20,), float(comm.rank), device="cuda")
comm.allreduce(x)                           # in place, on torch's current stream
g = comm.allgather(x[:4])                   # new tensor, shape (world_size, 4)
with maco.group():                          # sends and receives issued together
    comm.send(x, (comm.rank + 1) % comm.size)
    y = comm.recv(src=(comm.rank - 1) % comm.size, shape=x.shape, dtype=x.dtype)
print(comm.rank, x[0].item(), g[:, 0].tolist(), y[0].item())
