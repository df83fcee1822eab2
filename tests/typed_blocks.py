"""Hand-written transformer blocks for ``mpsim import-torch`` tests (PyTorch only, no Hugging Face).

``stack`` is two pre-norm blocks whose attention names its heads (``num_heads``): each
imports as a ``block`` of typed layers. ``anonymous`` is the same without ``num_heads``:
the importer cannot tell the heads, so each block stays ``custom``.
"""

from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, named: bool):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.heads = heads
        if named:
            self.num_heads = heads

    def forward(self, x):
        b, t, d = x.shape

        def split(y):
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, named: bool):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads, named)
        self.up, self.act, self.down = nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(self.act(self.up(self.norm2(x))))


class Stack(nn.Module):
    def __init__(self, named: bool):
        super().__init__()
        self.blocks = nn.ModuleList(Block(64, 4, named) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def stack():
    return Stack(named=True)


def anonymous():
    return Stack(named=False)
