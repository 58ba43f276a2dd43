"""Greedy text of radixserve and llama.cpp on the same GGUF file, prompt by prompt.

llama.cpp is the reference for GGUF arithmetic. For every prompt this runs llama.cpp's
`llama-simple` (greedy) and radixserve's engine (temperature 0, top-2 logprobs per step), and
reports where the two texts part. A parting counts as a near tie when llama.cpp's token is
radixserve's second choice there and radixserve's top-2 logprobs are within --tie-nats: both
engines round their activations differently (radixserve: int16 per 32, or int8 per 256 for
K-quants where that measured faster; llama.cpp: int8), so a near tie can go either way.

    .venv/bin/python benchmarks/check_vs_llama_cpp.py --model-path model.Q4_K_M.gguf \\
        --llama-simple ~/.cache/radixserve-bench/<build>/bin/llama-simple
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, the first person to walk on the Moon",
    "Water boils at",
    "A good way to learn a new language is",
    "The following is a list of fruits:",
    "import numpy as np\n",
    "Question: What is 12 times 12?\nAnswer:",
]


def llama_text(binary: Path, model: Path, prompt: str, tokens: int, threads: int) -> str:
    """llama-simple's continuation of `prompt` (it prints the prompt, then the tokens)."""
    out = subprocess.run(
        [str(binary), "-m", str(model), "-n", str(tokens), prompt],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"},
    ).stdout
    if not out.startswith(prompt):
        raise RuntimeError(f"llama-simple did not echo the prompt: {out[:80]!r}")
    # it ends its output with one newline of its own, after the last token
    return out[len(prompt) : -1] if out.endswith("\n") else out[len(prompt) :]


def compare(ours: dict[str, Any], theirs: str, tokenizer: Any, tie_nats: float) -> dict[str, Any]:
    """Where our greedy tokens stop spelling llama.cpp's text, and how close our top two were."""
    steps = ours["meta_info"]["output_top_logprobs"]
    ids = ours["output_ids"]
    for i in range(len(ids)):
        if ids[i] == tokenizer.eos_token_id and tokenizer.decode(ids[:i]) == theirs:
            return {"same": True, "position": i, "gap_nats": None, "near_tie": False}  # both ended
        if not theirs.startswith(tokenizer.decode(ids[: i + 1])):
            top = steps[i]
            if len(top) < 2:
                return {"same": False, "position": i, "gap_nats": None, "near_tie": False}
            gap = top[0][0] - top[1][0]
            second = tokenizer.decode([*ids[:i], top[1][1]])
            near_tie = theirs.startswith(second) and gap <= tie_nats
            return {"same": False, "position": i, "gap_nats": gap, "near_tie": near_tie}
    return {"same": True, "position": len(ids), "gap_nats": None, "near_tie": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--llama-simple", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tie-nats", type=float, default=0.1)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoTokenizer

    from radixserve import Engine
    from radixserve.models.gguf import ensure_metadata

    tokenizer = AutoTokenizer.from_pretrained(ensure_metadata(args.model_path))
    theirs = [
        llama_text(args.llama_simple, args.model_path, p, args.tokens, args.threads)
        for p in tqdm(PROMPTS, desc="llama.cpp")
    ]
    params = {"max_new_tokens": args.tokens, "temperature": 0}
    results = []
    with Engine(model_path=str(args.model_path), runtime="thread", dtype=args.dtype) as engine:
        for prompt, their_text in tqdm(list(zip(PROMPTS, theirs, strict=True)), desc="radixserve"):
            ours = engine.generate(prompt, params, return_logprob=True, top_logprobs_num=2)
            row = compare(ours, their_text, tokenizer, args.tie_nats)
            row.update(prompt=prompt, ours=ours["text"], llama_cpp=their_text)
            results.append(row)
    for row in results:
        print(json.dumps(row))
    same = sum(r["same"] for r in results)
    ties = sum(r["near_tie"] for r in results)
    print(
        f"{same}/{len(results)} prompts identical for {args.tokens} tokens; "
        f"{ties} part at a near tie (top-2 within {args.tie_nats} nats); "
        f"{len(results) - same - ties} part elsewhere"
    )


if __name__ == "__main__":
    main()
