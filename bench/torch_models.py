"""The PyTorch side's models, shared by bench/torch_cpu.py and bench/torch_amp_gpu.py: the models
of bench/bench_models.hpp (A, B, C, D; W only on the GPU) with Keras's default initializers
(glorot_uniform kernels, zero biases), the CNNs in channels-last and flattened in Keras's NHWC
order, so that both sides train the same functions of the same shapes.

    from torch_models import make_model, input_shape, NUM_CLASSES
"""
import torch
import torch.nn as nn

NUM_CLASSES = 10


class FlattenNHWC(nn.Module):
    """Keras's Flatten of an NHWC tensor: N,C,H,W (channels-last storage) -> N, H*W*C."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


def make_model(which):
    """Model `which` (A, B, C, D or W); the CNNs (B, C) in channels-last memory format."""
    def mlp(inp, width, hidden):
        layers, d = [], inp
        for _ in range(hidden):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        return nn.Sequential(*layers, nn.Linear(d, NUM_CLASSES))

    def cnn(cin, flat):
        return nn.Sequential(
            nn.Conv2d(cin, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            FlattenNHWC(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES))

    model = {"A": lambda: mlp(784, 512, 2), "B": lambda: cnn(3, 6 * 6 * 64), "C": lambda: cnn(1, 5 * 5 * 64),
             "D": lambda: mlp(1024, 2048, 3), "W": lambda: mlp(1024, 4096, 3)}[which]()
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    if which in "BC":
        model = model.to(memory_format=torch.channels_last)
    return model


def input_shape(which, batch):
    """The input's shape in PyTorch's N,C,H,W order (channels-last storage is the caller's)."""
    return {"A": (batch, 784), "B": (batch, 3, 32, 32), "C": (batch, 1, 28, 28)}.get(which, (batch, 1024))
