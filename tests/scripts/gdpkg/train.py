"""Run as ``-m gdpkg.train``: a relative import, a missing zero_grad, then a crash."""
import sys

import torch

from .model import make_model

torch.manual_seed(0)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(4):
    model(torch.randn(8, 4)).pow(2).mean().backward()  # BUG-LINE
    optimizer.step()
    if i == 2 and "--crash" in sys.argv:
        raise RuntimeError(f"crash in {__name__} from {__spec__.name}")
