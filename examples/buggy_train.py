"""A small, realistic training script with a silent gradient bug.

Run it under graddoctor:   graddoctor check examples/buggy_train.py
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 20), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=16, shuffle=True)

backbone = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
head = nn.Linear(32, 4)
optimizer = torch.optim.AdamW([*backbone.parameters(), *head.parameters()], lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(3):
    for x, y in loader:
        backbone.zero_grad()  # bug: the head's gradients are never cleared
        loss = loss_fn(head(backbone(x)), y)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
