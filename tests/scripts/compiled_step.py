"""torch.compile around a whole training step that never clears its gradients."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile  # COMPILE-LINE
def train_step(x):
    loss = model(x).pow(2).mean()
    loss.backward()  # BUG-LINE: no zero_grad
    optimizer.step()
    return loss


for i in range(6):
    train_step(torch.randn(8, 4))
