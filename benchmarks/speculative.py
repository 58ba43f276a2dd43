"""Decode speed with and without speculative decoding, side by side in one run.

    PYTHONPATH=. nice .venv/bin/python benchmarks/speculative.py --rounds 3

Two engines on the same model (plain, and --speculative-algorithm NGRAM, or STANDALONE with
--draft-model-path) run the same workloads in turns (plain, spec, plain, spec, ...), so machine
noise hits both alike; the table reports the median of the rounds and the spec / plain ratio.

Workloads: "copy" asks the model to repeat a passage with one change (the output quotes the
prompt, where n-gram drafts shine); "chat" asks short random questions. Each request runs
alone (streamed, so its time to first token is known) and decode tok/s is
(completion tokens - 1) / (time after the first token); "batch" rows run the workload's prompts
together and report output tok/s over the whole batch. Greedy decoding, so both engines emit
the same tokens (checked).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--quantization", default=None)
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
            "speculative_algorithm": "STANDALONE",
            "speculative_draft_model_path": args.draft_model_path,
        }
    else:
        spec_args["speculative_algorithm"] = "NGRAM"
    label = spec_args["speculative_algorithm"]
    with Engine(**base) as plain, Engine(**base, **spec_args) as spec:
        loads = Workloads(plain, seed=0)
        rows: dict[tuple[str, str], dict[str, list[float]]] = {}
        accept: dict[str, list[int]] = {}  # workload -> [verify rounds, accepted drafts]
        for _ in range(args.rounds):
            for mode, runner in (("alone", run_alone), ("batch", run_batch)):
                for name, (prompts, max_new) in loads.next().items():
                    cell = rows.setdefault((name, mode), {"plain": [], "spec": []})
                    want = got = None
                    for tag, engine in (("plain", plain), ("spec", spec)):
                        before = spec.get_server_info()
                        rate, outputs = runner(engine, prompts, max_new)
                        if tag == "spec":
                            after = spec.get_server_info()
                            totals = accept.setdefault(name, [0, 0])
                            for k, key in enumerate(
                                ("spec_verify_rounds_total", "spec_accepted_tokens_total")
                            ):
                                totals[k] += after[key] - before[key]
                        cell[tag].append(rate)
                        want, got = (outputs, got) if tag == "plain" else (want, outputs)
                    if want != got:
                        logging.warning("%s/%s: outputs differ with speculation", name, mode)
    print(f"\n{label}, {args.num_draft_tokens} tokens per verify, median of {args.rounds} rounds")
    print("| Workload | Mode | Plain decode tok/s | Spec decode tok/s | Spec / plain |")
    print("| :--- | :--- | ---: | ---: | ---: |")
    for (name, mode), cell in rows.items():
        p, s = statistics.median(cell["plain"]), statistics.median(cell["spec"])
        print(f"| {name} | {mode} | {p:.1f} | {s:.1f} | {s / p:.2f}x |")
    print("\nTokens per verify round (spec_accept_length), by workload:")
    for name, (rounds, accepted) in accept.items():
        print(f"  {name}: {(rounds + accepted) / rounds if rounds else 0.0:.2f}")


if __name__ == "__main__":
    main()
