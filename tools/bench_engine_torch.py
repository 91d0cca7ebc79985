#!/usr/bin/python3
"""PyTorch eager CPU baseline for tools/bench-engine: the same three models and
batches, one thread, median step time of forward + backward + AdamW.

Optional: needs Debian's python3-torch. Never used by the test suite."""
import argparse
import json
import os
import statistics
import time

# One thread everywhere, set before torch loads its BLAS: torch.set_num_threads does not
# reach Debian's generic-BLAS build, whose OpenBLAS would otherwise use every core.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.out = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=96, ctx=128, layers=4, heads=4, c=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, c)
        self.pos = nn.Embedding(ctx, c)
        self.blocks = nn.Sequential(*[Block(c, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab)  # untied, as in hetrain

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        return self.head(self.ln(self.blocks(x)))


def models():
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    cnn = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    return {
        "mlp": (mlp, lambda: (torch.randn(256, 784), torch.randint(0, 10, (256,))), False),
        "cnn": (cnn, lambda: (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))), False),
        "gpt": (Gpt(), lambda: (torch.randint(0, 96, (16, 128)), torch.randint(0, 96, (16, 128))), True),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = {}
    for name, (model, batch, seq) in models().items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = batch()
        times = []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        out[name] = {"median_ms": statistics.median(times) * 1e3}
        print(f"torch {name}: {out[name]['median_ms']:.2f} ms/step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "threads": 1, "models": out}, f, indent=2)


if __name__ == "__main__":
    main()
