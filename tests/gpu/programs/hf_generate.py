"""A real program of the kind gpuws's users profile: a Llama-style model's `generate`
with Hugging Face transformers (random weights: nothing to download; bf16 on the GPU),
batch 4, a 512-token prompt, 24 new tokens, twice (a warm-up call, then the call that
counts, as people write it). Run as a `cmd:` workload or a `file:` one.

Usage: python3 hf_generate.py [--layers N] [--new-tokens N]
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build(layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=8, max_position_embeddings=1024)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()


def generate(model: LlamaForCausalLM, batch: int, prompt: int, new_tokens: int) -> torch.Tensor:
    ids = torch.randint(0, 32000, (batch, prompt), device="cuda")
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args()
    model = build(args.layers)
    generate(model, 4, 512, args.new_tokens)        # warm-up
    out = generate(model, 4, 512, args.new_tokens)  # the call that counts
    torch.cuda.synchronize()
    print("generated", tuple(out.shape))


if __name__ == "__main__":
    main()
