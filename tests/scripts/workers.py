"""DataLoader worker processes, two forked (default) or one spawned: a spawned worker
re-imports this file as ``__mp_main__`` to unpickle the dataset class, so
``__main__.__file__`` must be right and the top level must be guarded."""
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((4,), float(i % 7))
        return x, x.sum(0, keepdim=True)


def square(x):
    print(f"pool worker computes {x}", flush=True)  # a child writing to stdout
    return x * x


def main():
    context = sys.argv[1] if len(sys.argv) > 1 else "fork"
    torch.manual_seed(0)
    if context == "spawn":
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            print("pool results", pool.map(square, [1, 2, 3]), file=sys.stderr)
    # spawned: one worker (each is a fresh interpreter that imports torch, once per epoch)
    workers = 1 if context == "spawn" else 2
    loader = DataLoader(Squares(), batch_size=8, num_workers=workers, multiprocessing_context=context)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
