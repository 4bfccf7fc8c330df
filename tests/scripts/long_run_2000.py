"""A clean loop of 2,000 optimizer steps (the pictures' folded long run): a tiny model, a
step-decay schedule, one dropout layer, an eval pass every 500 steps."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=500, gamma=0.5)
x, y = torch.randn(64, 8), torch.randn(64, 2)

for step in range(2000):
    optimizer.zero_grad()
    batch = slice((step * 8) % 64, (step * 8) % 64 + 8)
    loss = nn.functional.mse_loss(model(x[batch]), y[batch])
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 500 == 499:
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
