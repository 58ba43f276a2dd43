"""Decode speed with and without speculative decoding, side by side in one run.

    PYTHONPATH=. nice .venv/bin/python benchmarks/speculative.py --rounds 3

Engines on the same model (plain; --speculative-algorithm NGRAM, or STANDALONE with
--draft-model-path, or EAGLE / EAGLE3 with --algorithm and a head as --draft-model-path; the same with --speculative-adaptive, unless --no-adaptive; with --chain
the same drafting chains only, against the default settings' trees) run the same
workloads in turns (plain, spec, adaptive, plain, ...), so machine noise hits them alike; the
table reports the median of the rounds and each one's ratio to plain.

Workloads: "copy" asks the model to repeat a passage with one change (the output quotes the
prompt, where n-gram drafts shine); "chat" asks short random questions. Each request runs
alone (streamed, so its time to first token is known) and decode tok/s is
(completion tokens - 1) / (time after the first token); "batch" rows run the workload's prompts
together and report output tok/s over the whole batch. Greedy decoding, so every engine emits
the same tokens (checked).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import statistics
import time
from typing import Any

from radixserve import Engine

PASSAGES = [
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens, and wrote the weather in a leather logbook. Ships passed safely "
    "through the narrow channel because the light never failed.",
    "def moving_average(values, window):\n    result = []\n    total = 0.0\n    for i, value in "
    "enumerate(values):\n        total += value\n        if i >= window:\n            total -= "
    "values[i - window]\n        result.append(total / min(i + 1, window))\n    return result\n",
    '{"name": "Ada", "role": "engineer", "team": "compilers", "languages": ["C", "Rust", '
    '"Python"], "location": "Lisbon", "start_year": 2019, "manager": "Grace"}',
    "Preheat the oven to 180 degrees. Mix the flour, sugar and butter until crumbly, then add "
    "two eggs and the milk. Pour the batter into a lined tin and bake for forty minutes, until "
    "a skewer comes out clean.",
]
CHANGES = [
    ("evening", "morning"),
    ("window", "width"),
    ("Lisbon", "Porto"),
    ("forty", "thirty"),
]
QUESTIONS = [
    "What is the capital of {}?",
    "Give me one tip for learning {}.",
    "Write two sentences about {}.",
    "Why is {} interesting?",
]
TOPICS = ["Japan", "chess", "the ocean", "Python", "music", "volcanoes", "Canada", "gardening"]


def chat(engine: Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


class Workloads:
    """Fresh prompts for every run: the n-gram cache is shared across requests, so repeating
    an exact chat prompt would let it replay the earlier answer and flatter speculation."""

    def __init__(self, engine: Engine, seed: int) -> None:
        self.engine = engine
        self.questions = [q.format(t) for q in QUESTIONS for t in TOPICS]
        random.Random(seed).shuffle(self.questions)
        self.runs = 0

    def next(self) -> dict[str, tuple[list[str], int]]:
        i = self.runs
        self.runs += 1
        # The copy task keeps its passages (they are in the prompt anyway) with a new wording.
        copy = [
            chat(
                self.engine,
                f"Repeat this text exactly, but replace '{old}' with '{new}' (version {i}):"
                f"\n\n{text}",
            )
            for text, (old, new) in zip(PASSAGES, CHANGES, strict=True)
        ]
        picked = self.questions[4 * i : 4 * i + 4]
        if len(picked) < 4:
            raise SystemExit("out of distinct chat questions: use fewer --rounds")
        return {"copy": (copy, 96), "chat": ([chat(self.engine, q) for q in picked], 64)}


def run_alone(engine: Engine, prompts: list[str], max_new: int) -> tuple[float, list[Any]]:
    """Decode tok/s summed over requests run one at a time (streamed)."""
    tokens, seconds, outputs = 0, 0.0, []
    params = {"temperature": 0, "max_new_tokens": max_new}
    for prompt in prompts:
        first = None
        ids: list[int] = []
        for chunk in engine.generate(prompt=prompt, sampling_params=params, stream=True):
            if first is None:
                first = time.perf_counter()
            ids.extend(chunk["output_ids"])
        end = time.perf_counter()
        assert first is not None
        tokens += len(ids) - 1
        seconds += end - first
        outputs.append(ids)
    return tokens / seconds, outputs


def run_batch(engine: Engine, prompts: list[str], max_new: int) -> tuple[float, list[Any]]:
    params = {"temperature": 0, "max_new_tokens": max_new}
    engine.flush_cache()
    start = time.perf_counter()
    results = engine.generate(prompt=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    return tokens / elapsed, [r["output_ids"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-draft-tokens", type=int, default=8)
    parser.add_argument("--draft-model-path", default=None, help="STANDALONE instead of NGRAM")
    parser.add_argument(
        "--algorithm",
        default=None,
        choices=["STANDALONE", "EAGLE", "EAGLE3"],
        help="with --draft-model-path (default STANDALONE): EAGLE / EAGLE3 for a trained head "
        "(benchmarks/train_eagle_head.py makes one)",
    )
    parser.add_argument("--token-map", default=None, help="EAGLE: --speculative-token-map")
    parser.add_argument("--quantization", default=None)
    parser.add_argument(
        "--no-adaptive", action="store_true", help="leave out the --speculative-adaptive engine"
    )
    parser.add_argument(
        "--eagle-topk", type=int, default=None, help="STANDALONE: draft trees of this breadth"
    )
    parser.add_argument("--num-steps", type=int, default=None, help="STANDALONE: draft steps")
    parser.add_argument(
        "--chain",
        action="store_true",
        help="add an engine that drafts chains only (NGRAM max BFS breadth 1, or topk 1), to "
        "compare with the tree drafts of the default settings",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    base: dict[str, Any] = {"dtype": args.dtype, "max_total_tokens": 16384, "runtime": "thread"}
    if args.model_path:
        base["model_path"] = args.model_path
    if args.quantization:
        base["quantization"] = args.quantization
    spec_args = {"speculative_num_draft_tokens": args.num_draft_tokens}
    if args.draft_model_path:
        spec_args |= {
            "speculative_algorithm": args.algorithm or "STANDALONE",
            "speculative_draft_model_path": args.draft_model_path,
            "speculative_token_map": args.token_map,
            "speculative_eagle_topk": args.eagle_topk,
            "speculative_num_steps": args.num_steps,
        }
        chain_args = {**spec_args, "speculative_eagle_topk": 1, "speculative_num_steps": None}
    else:
        spec_args["speculative_algorithm"] = "NGRAM"
        chain_args = {**spec_args, "speculative_ngram_max_bfs_breadth": 1}
    label = spec_args["speculative_algorithm"]
    variants = {"plain": {}, "spec": spec_args}
    if args.chain:
        variants["chain"] = chain_args
    if not args.no_adaptive:
        variants["adaptive"] = {**spec_args, "speculative_adaptive": True}
    with contextlib.ExitStack() as stack:
        engines = {
            tag: stack.enter_context(Engine(**base, **extra)) for tag, extra in variants.items()
        }
        loads = Workloads(engines["plain"], seed=0)
        rows: dict[tuple[str, str], dict[str, list[float]]] = {}
        # (engine, workload) -> [verify rounds, accepted drafts]
        accept: dict[tuple[str, str], list[int]] = {}
        for _ in range(args.rounds):
            for mode, runner in (("alone", run_alone), ("batch", run_batch)):
                for name, (prompts, max_new) in loads.next().items():
                    cell = rows.setdefault((name, mode), {tag: [] for tag in engines})
                    outputs_by_tag = {}
                    for tag, engine in engines.items():
                        before = engine.get_server_info()
                        rate, outputs = runner(engine, prompts, max_new)
                        if tag != "plain":
                            after = engine.get_server_info()
                            totals = accept.setdefault((tag, name), [0, 0])
                            for k, key in enumerate(
                                ("spec_verify_rounds_total", "spec_accepted_tokens_total")
                            ):
                                totals[k] += after[key] - before[key]
                        cell[tag].append(rate)
                        outputs_by_tag[tag] = outputs
                    for tag, outputs in outputs_by_tag.items():
                        if outputs != outputs_by_tag["plain"]:
                            logging.warning("%s/%s: %s outputs differ from plain", name, mode, tag)
    print(f"\n{label}, {args.num_draft_tokens} tokens per verify, median of {args.rounds} rounds")
    spec_tags = [t for t in variants if t != "plain"]
    header = " | ".join(f"{t} tok/s | {t} / plain" for t in spec_tags)
    print(f"| Workload | Mode | plain decode tok/s | {header} |")
    print("| :--- | :--- | ---: |" + " ---: | ---: |" * len(spec_tags))
    for (name, mode), cell in rows.items():
        p = statistics.median(cell["plain"])
        parts = []
        for tag in spec_tags:
            s = statistics.median(cell[tag])
            parts.append(f"{s:.1f} | {s / p:.2f}x")
        print(f"| {name} | {mode} | {p:.1f} | " + " | ".join(parts) + " |")
    print("\nTokens per verify round (spec_accept_length), by engine and workload:")
    for (tag, name), (rounds, accepted) in accept.items():
        print(f"  {tag} {name}: {(rounds + accepted) / rounds if rounds else 0.0:.2f}")


if __name__ == "__main__":
    main()
