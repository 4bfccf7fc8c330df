"""An optimizer step that raises (its closure fails; the script carries on), then a loop
without zero_grad: later steps must still be seen as steps."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def failing_closure():
    raise ValueError("the closure failed")


try:
    optimizer.step(failing_closure)
except ValueError:
    pass
for i in range(5):
    model(torch.randn(8, 4)).pow(2).mean().backward()  # BUG-LINE
    optimizer.step()
