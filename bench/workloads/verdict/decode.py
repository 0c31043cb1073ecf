"""A launch-bound program: a small decoder generating tokens one at a time (an LLM's
decode loop in miniature, without a model download). Each step runs a dozen tiny kernels
(embedding, 4 layers of matmul + norm + activation, the logits, argmax) on batch 1, so
the GPU waits on Python and the launches between them. Prints its tokens/s."""

import time

import torch

torch.manual_seed(0)
dev = "cuda"
vocab, width, layers = 4096, 512, 4
emb = torch.randn(vocab, width, device=dev, dtype=torch.float16)
ws = [torch.randn(width, width, device=dev, dtype=torch.float16) / width ** 0.5
      for _ in range(layers)]
head = torch.randn(width, vocab, device=dev, dtype=torch.float16) / width ** 0.5
token = torch.zeros(1, dtype=torch.long, device=dev)
steps = 200
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    x = emb[token]
    for w in ws:
        x = torch.nn.functional.layer_norm(torch.nn.functional.gelu(x @ w), (width,))
    token = (x @ head).argmax(-1)
    token.item()  # what generate() does each step to check for the end token
torch.cuda.synchronize()
print("decode: %.0f tokens/s" % (steps / (time.perf_counter() - t0)))
