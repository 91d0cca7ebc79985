#!/usr/bin/python3
"""PyTorch eager baseline for tools/bench-engine: the same models and batches (the three
reference models, and gpt-large: GPT-2 small's shape at T 1024, batch 8), --threads
threads, median step time of forward + backward + AdamW (defaults: lr 1e-3, weight decay
0.01, as hetrain's side), and the minor page faults per step. --device cuda runs on GPU 0
in fp32 (TF32 off, as hetrain's products), each step timed to torch.cuda.synchronize();
it exits 77 where torch has no usable CUDA.

tools/bench-engine runs it twice: as installed, and tuned, with glibc's malloc trimming
off (MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ in the environment); the JSON
records which, read from this process's environment.

Optional: needs Debian's python3-torch. Never used by the test suite."""
import argparse
import json
import os
import resource
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--models", default="mlp,cnn,gpt")
ap.add_argument("--json")
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
ARGS = ap.parse_args()
if ARGS.threads < 1 or ARGS.steps < 1 or ARGS.warmup < 0:
    ap.error(f"--threads {ARGS.threads}, --steps {ARGS.steps}, --warmup {ARGS.warmup}: "
             "expected threads and steps >= 1, warmup >= 0")

# The thread count is set before torch loads its BLAS: torch.set_num_threads does not
# reach Debian's generic-BLAS build, whose OpenBLAS would otherwise use every core.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

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
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
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
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def models():
    """name -> (make the model, make its batch); made only when asked for."""
    def mlp():
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))

    def cnn():
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))

    return {
        "mlp": (mlp, lambda: (torch.randn(256, 784), torch.randint(0, 10, (256,)))),
        "cnn": (cnn, lambda: (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)))),
        "gpt": (Gpt, lambda: (torch.randint(0, 96, (16, 128)), torch.randint(0, 96, (16, 128)))),
        "gpt-large": (lambda: Gpt(vocab=50257, ctx=1024, layers=12, heads=12, c=768),
                      lambda: (torch.randint(0, 50257, (8, 1024)), torch.randint(0, 50257, (8, 1024)))),
    }


def main():
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(0)
    if ARGS.device == "cuda":
        if not torch.cuda.is_available():
            print(f"torch {torch.__version__}: --device cuda: no usable CUDA in this torch; skipped")
            raise SystemExit(77)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    device = torch.device(ARGS.device)
    sync = torch.cuda.synchronize if ARGS.device == "cuda" else (lambda: None)
    all_models = models()
    names = ARGS.models.split(",")
    for name in names:
        if name not in all_models:
            ap.error(f"--models: unknown model {name!r}; expected some of {', '.join(all_models)}")
    tuned = {v: os.environ[v] for v in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_") if v in os.environ}
    label = "tuned" if tuned else "as installed"
    out = {}
    for name in names:
        make_model, batch = all_models[name]
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        x, y = (t.to(device) for t in batch())
        times = []
        for i in range(ARGS.warmup + ARGS.steps):
            if i == ARGS.warmup:
                faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            if i >= ARGS.warmup:
                times.append(time.perf_counter() - t0)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / ARGS.steps
        out[name] = {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
                     "minor_faults_per_step": faults}
        print(f"torch ({label}) {name}: {out[name]['median_ms']:.2f} ms/step, "
              f"{faults:.0f} page faults/step")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "threads": ARGS.threads, "device": ARGS.device,
                       "gpu": torch.cuda.get_device_name(0) if ARGS.device == "cuda" else None, "malloc": label,
                       "malloc_env": tuned, "models": out}, f, indent=2)


if __name__ == "__main__":
    main()
