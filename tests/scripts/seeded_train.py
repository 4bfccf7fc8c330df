"""A seeded run that saves everything it computed (parameters, BatchNorm statistics, optimizer
state, losses, the final RNG state) to argv[1]: identical with and without graddoctor."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(96, 6), torch.randint(0, 3, (96,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
losses = []
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y) / 2
        loss.backward()
        losses.append(loss.item())
        if i % 2 == 1:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=epoch % 2 == 0)
    scheduler.step()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "losses": losses,
            "rng": torch.get_rng_state()}, sys.argv[1])
