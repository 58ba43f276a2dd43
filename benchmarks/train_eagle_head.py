"""Train a small EAGLE-1 draft head for a Llama-family model, for the speculative benchmark.

    PYTHONPATH=. nice .venv/bin/python benchmarks/train_eagle_head.py --out /tmp/eagle-head

No trained EAGLE head for the default model can be downloaded here, so this makes one the way
EAGLE heads are made (self-distillation): the model answers a set of generated instructions
greedily, a float32 prefill of each prompt + answer records the model's final normed hidden
state at every position (what radixserve hands an EAGLE head), and one decoder layer behind
`fc([embedding of token p+1, feature at p])` learns to predict the feature at p + 1 (smooth L1)
and, through the model's own LM head, token p + 2 (cross-entropy, weight 0.1), with a little
uniform noise on the input features. The head is written in the layout SGLang loads
(`LlamaForCausalLMEagle`: fc.*, layers.0.*, no embedding and no LM head), with `token_map.pt`
beside it: the `--hot-tokens` tokens the answers use most, for `--speculative-token-map`. The
instructions use topics and phrasings the benchmark's chat workload does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from radixserve import Engine

TEMPLATES = [
    "Describe {} in three sentences.",
    "Explain how {} works to a child.",
    "Write a short poem about {}.",
    "List five facts about {}.",
    "What are the pros and cons of {}?",
    "Write a short story that involves {}.",
    "Give step-by-step advice about {}.",
    "Summarize the history of {}.",
]
TOPICS = [
    "bicycles",
    "rainbows",
    "the moon",
    "bread baking",
    "electric cars",
    "honeybees",
    "the internet",
    "mountains",
    "coffee",
    "the Roman empire",
    "photosynthesis",
    "football",
    "libraries",
    "submarines",
    "deserts",
    "painting",
    "trains",
    "recycling",
    "earthquakes",
    "the piano",
    "birds",
    "solar panels",
    "friendship",
    "rivers",
    "robots",
    "tea",
    "snow",
    "airplanes",
    "forests",
    "mathematics",
]


class EagleHead(nn.Module):
    """SGLang's LlamaForCausalLMEagle with one decoder layer (no input norm), in plain PyTorch
    with the target's HF conventions (RoPE by rotate_half, grouped KV heads)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = h // self.heads
        inter = cfg["intermediate_size"]
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.eps = cfg["rms_norm_eps"]
        # transformers 5 writes RoPE settings under rope_parameters.
        rope = cfg.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise ValueError("this trainer handles plain RoPE only")
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        inv = 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[None], emb.sin()[None]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """embeds, features: [T, H] of one sequence (row p: token p + 1, feature p)."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        t = x.shape[0]
        pos = torch.arange(t)
        q = self.q_proj(x).view(t, self.heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        q, k = self._rope(q, pos), self._rope(k, pos)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        x = x + self.o_proj(attn.transpose(0, 1).reshape(t, -1))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.post_norm
        mlp = self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))
        return x + mlp

    def sglang_state_dict(self) -> dict[str, torch.Tensor]:
        names = {
            "fc.weight": self.fc.weight,
            "fc.bias": self.fc.bias,
            "layers.0.post_attention_layernorm.weight": self.post_norm,
        }
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"layers.0.self_attn.{proj}.weight"] = getattr(self, proj).weight
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"layers.0.mlp.{proj}.weight"] = getattr(self, proj).weight
        return {k: v.detach().contiguous().clone() for k, v in names.items()}


def make_prompts(engine: Engine) -> list[str]:
    texts = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    return [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        for text in texts
    ]


def collect(args: argparse.Namespace) -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    """Token ids and float32 features [L, H] of each prompt + greedy answer."""
    base: dict[str, Any] = {"runtime": "thread", "max_total_tokens": 32768}
    if args.model_path:
        base["model_path"] = args.model_path
    with Engine(**base, quantization="gguf" if args.fast_generate else None) as gen:
        prompts = make_prompts(gen)[: args.num_prompts]
        logging.warning("generating %d answers of up to %d tokens", len(prompts), args.max_new)
        outs = gen.generate(prompts, {"temperature": 0, "max_new_tokens": args.max_new})
        prompt_ids = [gen.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    sequences = [p + o["output_ids"] for p, o in zip(prompt_ids, outs, strict=True)]
    tokens: list[torch.Tensor] = []
    features: list[torch.Tensor] = []
    with Engine(**base, dtype="float32", disable_radix_cache=True) as ref:
        runner = ref.scheduler.step_runner.runner
        runner.capture_final = True
        got: list[torch.Tensor] = []
        ref.scheduler.step_runner.on_features = lambda r, s, n, f: got.append(f.clone())
        for seq in tqdm(sequences, desc="features"):
            got.clear()
            ref.generate(input_ids=seq, sampling_params={"max_new_tokens": 1})
            tokens.append(torch.tensor(seq))
            features.append(torch.cat(got)[: len(seq)].float())
        embed = runner.model.model.embed_tokens.weight.detach().float().clone()
        cfg = json.loads((Path(runner.model_dir) / "config.json").read_text())
        model_dir = Path(runner.model_dir)
    return tokens, features, (embed, cfg, model_dir)


def train(
    head: EagleHead,
    embed: torch.Tensor,
    tokens: list[torch.Tensor],
    features: list[torch.Tensor],
    args: argparse.Namespace,
) -> None:
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps = args.epochs * math.ceil(len(tokens) / args.accumulate)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    order = list(range(len(tokens)))
    rng = random.Random(0)
    for epoch in range(args.epochs):
        rng.shuffle(order)
        total = {"reg": 0.0, "ce": 0.0, "top1": 0.0, "n": 0}
        bar = tqdm(order, desc=f"epoch {epoch + 1}/{args.epochs}")
        for j, i in enumerate(bar):
            t, f = tokens[i], features[i]
            noisy = f[:-2] + (torch.rand_like(f[:-2]) - 0.5) * 2 * args.noise
            out = head(embed[t[1:-1]], noisy)
            reg = F.smooth_l1_loss(out, f[1:-1])
            logits = out @ embed.T
            ce = F.cross_entropy(logits, t[2:])
            ((reg + 0.1 * ce) / args.accumulate).backward()
            if (j + 1) % args.accumulate == 0 or j + 1 == len(order):
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            n = len(t) - 2
            total["reg"] += reg.item() * n
            total["ce"] += ce.item() * n
            total["top1"] += (logits.argmax(-1) == t[2:]).sum().item()
            total["n"] += n
            bar.set_postfix(
                reg=f"{total['reg'] / total['n']:.4f}",
                ce=f"{total['ce'] / total['n']:.3f}",
                top1=f"{total['top1'] / total['n']:.3f}",
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the head to")
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--num-prompts", type=int, default=240)
    parser.add_argument("--max-new", type=int, default=160)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--hot-tokens", type=int, default=4096, help="size of token_map.pt")
    parser.add_argument(
        "--fast-generate",
        action="store_true",
        help="generate the answers with --quantization gguf (a GGUF model only)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    start = time.perf_counter()
    tokens, features, (embed, cfg, model_dir) = collect(args)
    logging.warning(
        "%d sequences, %d tokens, %.0f s",
        len(tokens),
        sum(len(t) for t in tokens),
        time.perf_counter() - start,
    )
    head = EagleHead(cfg)
    train(head, embed, tokens, features, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {**cfg, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(head.sglang_state_dict(), str(out / "model.safetensors"))
    # A hot-token map for --speculative-token-map (FR-Spec): the tokens the answers use most,
    # so the head's LM head can cover a fraction of the vocabulary.
    counts = torch.bincount(torch.cat(tokens), minlength=embed.shape[0])
    hot = counts.argsort(descending=True)[: args.hot_tokens].sort().values
    torch.save(hot.tolist(), out / "token_map.pt")
    share = counts[hot].sum().item() / counts.sum().item()
    logging.warning("token_map.pt: %d tokens covering %.1f%% of the data", len(hot), 100 * share)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    logging.warning("EAGLE head written to %s (%.0f s in all)", out, time.perf_counter() - start)


if __name__ == "__main__":
    main()
