"""PyTorch DDP's side of `ddp_bench --mode overlap`: the tutorial's MNIST CNN,
one step with gradients synchronised (DDP's buckets, sent during backward)
and one under no_sync, alternating, every step started by all ranks together
after a barrier; medians of --iters of each after 2 warm-ups. Random images
and labels, as ddp_bench uses. Run under torchrun (gloo):

    torchrun --nproc-per-node 2 scripts/torch_ddp_mnist_bench.py --batch-size 64 --iters 20

scripts/two-machine-bench.sh --torch runs it on the two machines right after
the burn-ddp program, in the same invocation.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    """The tutorial's Net, as examples/mnist/net.rs has it (no dropout)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def step(model, optimizer, batch):
    images = torch.randn(batch, 1, 28, 28)
    labels = torch.randint(0, 10, (batch,))
    started = time.perf_counter()
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    synced, local = [], []
    for i in range(args.iters + 2):
        dist.barrier()
        took = step(model, optimizer, args.batch_size)
        if i >= 2:
            synced.append(took)
        dist.barrier()
        with model.no_sync():
            took = step(model, optimizer, args.batch_size)
        if i >= 2:
            local.append(took)
    if dist.get_rank() == 0:
        synced_ms = statistics.median(synced) * 1e3
        local_ms = statistics.median(local) * 1e3
        print(
            f"PyTorch {torch.__version__} DDP (gloo), MNIST CNN step, batch {args.batch_size} "
            f"per rank, world size {dist.get_world_size()}, {torch.get_num_threads()} thread(s) "
            f"per rank, {args.iters} steps each (median)"
        )
        print("| step | time | sync exposed (step - no_sync step) |")
        print("| --- | ---: | ---: |")
        print(f"| DDP (buckets during backward) | {synced_ms:.1f} ms | {synced_ms - local_ms:.1f} ms |")
        print(f"| no_sync | {local_ms:.1f} ms | |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
