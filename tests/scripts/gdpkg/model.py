import torch


def make_model():
    return torch.nn.Linear(4, 2)
