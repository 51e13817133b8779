"""The PyTorch side's models, shared by bench/torch_cpu.py and bench/torch_amp_gpu.py: the models
of bench/bench_models.hpp (A, B, C, D, G; W only on the GPU) with Keras's default initializers
(glorot_uniform kernels, zero biases), the CNNs in channels-last and flattened in Keras's NHWC
order, so that both sides train the same functions of the same shapes. G, the GPT-mini, is
idiomatic PyTorch: nn.Embedding, a learned position table, pre-norm blocks of nn.LayerNorm,
q/k/v/out nn.Linear with F.scaled_dot_product_attention(is_causal=True), a GELU MLP.

    from torch_models import make_model, input_shape, NUM_CLASSES
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES = 10
GPT = {"vocab": 128, "seq": 256, "d": 256, "heads": 4, "blocks": 4}  # bench_models.hpp's GptMini


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(B, T, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTMini(nn.Module):
    def __init__(self, vocab, seq, d, heads, blocks):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.empty(seq, d).uniform_(-0.05, 0.05))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class FlattenNHWC(nn.Module):
    """Keras's Flatten of an NHWC tensor: N,C,H,W (channels-last storage) -> N, H*W*C."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


def make_model(which):
    """Model `which` (A, B, C, D, G or W); the CNNs (B, C) in channels-last memory format."""
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

    if which == "G":
        model = GPTMini(**GPT)
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        return model
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
