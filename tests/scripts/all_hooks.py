"""Touches every hook graddoctor installs: DataLoader epochs, optimizer construction, both
zero_grads, a manual grad.zero_(), clipping, steps. ``--mess`` also changes the process state a
script can change; ``--crash`` raises at the end. Objects go to ``keep.objects``."""
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import keep

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
keep.objects.extend([model, optimizer, loader])
if "--mess" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["GRADDOCTOR_TEST_MESS"] = "1"
    sys.path.append("/nonexistent/graddoctor-test")
    sys.argv.append("--more")
    os.chdir("/")
    torch.set_grad_enabled(False)
    torch.set_grad_enabled(True)
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        if i % 2:
            model.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=False)
        if i == 2:  # after zero_grad(set_to_none=False): the grads exist
            for p in model.parameters():
                p.grad.zero_()  # a manual clear graddoctor must recognise
        torch.nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
if "--mess" in sys.argv:
    torch.set_grad_enabled(False)
    sys.stdout = open(os.devnull, "w")
if "--crash" in sys.argv:
    raise RuntimeError("crash at the end")
