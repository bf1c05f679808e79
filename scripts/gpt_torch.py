#!/usr/bin/env python3
"""The GPT of `mpu demo gpt --bench` in PyTorch, for speed comparisons.

Same model and step: vocabulary 64 (the bundled text's, padded), pre-LayerNorm
blocks of causal self-attention (fused QKV, torch's scaled_dot_product_attention)
and a GeLU MLP (tanh approximation, as Megatron's), word and position
embeddings, an untied head, cross entropy averaged over the step's tokens,
micro-batches of one sequence accumulated into one AdamW step (betas 0.9/0.95,
weight decay 0.01, gradient clipping at 1), no dropout. Prints one JSON line:
tokens/s (the median of --reps timed runs of --steps steps, after one warm-up
step), threads, recompute.

torch is only needed here, never to build mpu.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
except ImportError as e:  # the caller prints one line and goes on
    print(f"torch not importable: {e}", file=sys.stderr)
    sys.exit(3)


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def attention(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, h))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, h, heads, layers, seq, recompute):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.lnf, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)
        self.recompute = recompute

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.recompute == "full" else blk(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="sum")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--recompute", choices=["none", "full"], default="none")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    model = GPT(a.vocab, a.hidden, a.heads, a.layers, a.seq, a.recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, a.vocab, (a.micro_batches, a.seq + 1), generator=g)
    tokens = a.micro_batches * a.seq

    def step():
        opt.zero_grad(set_to_none=False)
        for m in range(a.micro_batches):
            loss = model(data[m:m + 1, :-1], data[m:m + 1, 1:]) / tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up: allocations, kernel selection
    rates = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        rates.append(a.steps * tokens / (time.perf_counter() - t0))
    print(json.dumps({"tokens_per_s": statistics.median(rates), "all": rates, "threads": a.threads,
                      "recompute": a.recompute, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
