"""Benchmark prompts, generated the way SGLang's bench_serving does (and under its flag names).

- random / random-ids: token ids drawn uniformly from the vocabulary (special tokens excluded),
  input and output lengths uniform in [max(len * ratio, 1), len] (SGLang's --random-range-ratio);
  `random` sends the decoded text, `random-ids` (or --tokenize-prompt) the ids themselves.
- generated-shared-prefix: --gsp-num-groups system prompts, each shared by
  --gsp-prompts-per-group questions (prompt = system + "\\n\\n" + question), shuffled.
- sharegpt: a local ShareGPT-style JSON file (--dataset-path); nothing is ever downloaded.

Every generator takes an explicit numpy Generator, so a seed reproduces the same prompts.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DATASET_NAMES = ("sharegpt", "random", "random-ids", "generated-shared-prefix")
# Random text is re-tokenized to check its length; a few rounds make it round-trip stable.
_RETOKENIZE_ROUNDS = 3


@dataclass(frozen=True)
class DatasetRow:
    prompt: str | list[int]  # text, or token ids (random-ids / --tokenize-prompt)
    prompt_len: int
    output_len: int
    group: int | None = None  # the shared-prefix group, for generated-shared-prefix


class DatasetError(ValueError):
    """The dataset options cannot produce prompts (a missing file, a bad length)."""


def add_dataset_args(
    parser: argparse.ArgumentParser, names: tuple[str, ...] = DATASET_NAMES
) -> None:
    """SGLang's dataset flags, with its defaults."""
    group = parser.add_argument_group("dataset")
    group.add_argument("--dataset-name", default="sharegpt", choices=names)
    group.add_argument("--dataset-path", default="", help="A local ShareGPT-style JSON file.")
    group.add_argument("--num-prompts", type=int, default=1000)
    group.add_argument("--sharegpt-output-len", type=int, default=None)
    group.add_argument("--sharegpt-context-len", type=int, default=None)
    group.add_argument("--random-input-len", type=int, default=1024)
    group.add_argument("--random-output-len", type=int, default=1024)
    group.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="Lengths are uniform in [len * ratio, len].",
    )
    group.add_argument("--apply-chat-template", action="store_true")
    group.add_argument("--prompt-suffix", default="")
    group.add_argument(
        "--tokenize-prompt", action="store_true", help="Send token ids instead of text."
    )
    group.add_argument("--seed", type=int, default=1)
    gsp = parser.add_argument_group("generated-shared-prefix dataset")
    # --gen-* are the names older SGLang versions of bench_offline_throughput used.
    gsp.add_argument("--gsp-num-groups", "--gen-num-groups", type=int, default=64)
    gsp.add_argument("--gsp-prompts-per-group", "--gen-prompts-per-group", type=int, default=16)
    gsp.add_argument("--gsp-system-prompt-len", "--gen-system-prompt-len", type=int, default=2048)
    gsp.add_argument("--gsp-question-len", "--gen-question-len", type=int, default=128)
    gsp.add_argument("--gsp-output-len", "--gen-output-len", type=int, default=256)
    gsp.add_argument("--gsp-range-ratio", type=float, default=1.0)


def compute_random_lens(
    full_len: int, range_ratio: float, num: int, rng: np.random.Generator
) -> list[int]:
    """`num` lengths uniform in [max(int(full_len * range_ratio), 1), full_len]."""
    if full_len < 1:
        raise DatasetError(f"lengths must be at least 1, got {full_len}")
    if not 0.0 <= range_ratio <= 1.0:
        raise DatasetError(f"the range ratio must be in [0, 1], got {range_ratio}")
    low = max(int(full_len * range_ratio), 1)
    return [int(x) for x in rng.integers(low, full_len + 1, size=num)]


def vocab_token_ids(tokenizer: Any) -> np.ndarray:
    """The ids a random prompt may use: the vocabulary without special tokens."""
    size = int(getattr(tokenizer, "vocab_size", 0) or len(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    ids = np.array([i for i in range(size) if i not in special], dtype=np.int64)
    if ids.size == 0:
        raise DatasetError("the tokenizer has no ordinary tokens to draw prompts from")
    return ids


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def random_text(tokenizer: Any, ids: list[int]) -> tuple[str, int]:
    """Decode `ids` to text whose re-tokenized length is at most len(ids) (random ids rarely
    round-trip exactly); returns the text and its re-tokenized length."""
    target = len(ids)
    text = tokenizer.decode(ids)
    for attempt in range(_RETOKENIZE_ROUNDS + target + 1):
        again = _encode(tokenizer, text)
        if len(again) <= target:
            return text, len(again)
        # Cut to the target; if that keeps failing, cut a little more each time (the empty
        # text always fits, so this ends).
        shorten = max(attempt - _RETOKENIZE_ROUNDS + 1, 0)
        text = tokenizer.decode(again[: max(target - shorten, 0)])
    return "", 0


def sample_random_requests(
    tokenizer: Any,
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    rng: np.random.Generator,
    return_text: bool = True,
) -> list[DatasetRow]:
    input_lens = compute_random_lens(input_len, range_ratio, num_prompts, rng)
    output_lens = compute_random_lens(output_len, range_ratio, num_prompts, rng)
    vocab = vocab_token_ids(tokenizer)
    rows = []
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        ids = [int(t) for t in rng.choice(vocab, size=n_in)]
        if return_text:
            text, length = random_text(tokenizer, ids)
            rows.append(DatasetRow(text, length, n_out))
        else:
            rows.append(DatasetRow(ids, n_in, n_out))
    return rows


def sample_generated_shared_prefix_requests(
    tokenizer: Any,
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    range_ratio: float,
    rng: np.random.Generator,
) -> list[DatasetRow]:
    vocab = vocab_token_ids(tokenizer)
    total = num_groups * prompts_per_group
    system_lens = compute_random_lens(system_prompt_len, range_ratio, num_groups, rng)
    question_lens = compute_random_lens(question_len, range_ratio, total, rng)
    output_lens = compute_random_lens(output_len, range_ratio, total, rng)
    systems = [
        random_text(tokenizer, [int(t) for t in rng.choice(vocab, size=n)])[0] for n in system_lens
    ]
    rows = []
    for i in range(total):
        group = i // prompts_per_group
        question, _ = random_text(
            tokenizer, [int(t) for t in rng.choice(vocab, size=question_lens[i])]
        )
        prompt = f"{systems[group]}\n\n{question}"
        rows.append(DatasetRow(prompt, len(tokenizer.encode(prompt)), output_lens[i], group))
    order = rng.permutation(total)
    return [rows[i] for i in order]


def _conversations(path: Path) -> list[tuple[str, str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read the ShareGPT file {path}: {exc}") from None
    pairs = []
    for item in data if isinstance(data, list) else []:
        turns = (
            item.get("conversations", item.get("conversation", []))
            if isinstance(item, dict)
            else []
        )
        if len(turns) >= 2:
            pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
    return pairs


def apply_chat_template(tokenizer: Any, prompt: str | list[int]) -> str | list[int]:
    """The prompt as one user turn of the chat template (ids are left alone)."""
    if not isinstance(prompt, str):
        return prompt
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    bos = getattr(tokenizer, "bos_token", None)
    return text.replace(bos, "") if bos else text


def sample_sharegpt_requests(
    tokenizer: Any,
    dataset_path: str,
    num_requests: int,
    rng: np.random.Generator,
    fixed_output_len: int | None = None,
    context_len: int | None = None,
    prompt_suffix: str = "",
    chat_template: bool = False,
) -> list[DatasetRow]:
    if not dataset_path:
        raise DatasetError(
            "--dataset-name sharegpt needs --dataset-path (a local ShareGPT JSON file); "
            "radixserve never downloads datasets. Or use --dataset-name random."
        )
    if fixed_output_len is not None and fixed_output_len < 4:
        raise DatasetError("--sharegpt-output-len must be at least 4")
    pairs = _conversations(Path(dataset_path).expanduser())
    rows: list[DatasetRow] = []
    for index in rng.permutation(len(pairs)):
        if len(rows) == num_requests:
            break
        prompt, completion = pairs[int(index)]
        if prompt_suffix:
            prompt += prompt_suffix
        if chat_template:
            prompt = apply_chat_template(tokenizer, prompt)
        prompt_len = len(tokenizer.encode(prompt))
        output_len = (
            len(_encode(tokenizer, completion)) if fixed_output_len is None else fixed_output_len
        )
        if prompt_len < 2 or output_len < 2:
            continue
        if context_len and prompt_len + output_len > context_len:
            continue
        rows.append(DatasetRow(prompt, prompt_len, output_len))
    if len(rows) < num_requests:
        logger.warning(
            "%s gave %d usable prompts of the %d asked", dataset_path, len(rows), num_requests
        )
    return rows


def _retext(row: DatasetRow, text: str | list[int], tokenizer: Any) -> DatasetRow:
    if not isinstance(row.prompt, str) or not isinstance(text, str):
        return row
    return DatasetRow(text, len(tokenizer.encode(text)), row.output_len, row.group)


def _to_ids(row: DatasetRow, tokenizer: Any) -> DatasetRow:
    if not isinstance(row.prompt, str):
        return row
    ids = [int(t) for t in tokenizer.encode(row.prompt)]
    return DatasetRow(ids, len(ids), row.output_len, row.group)


def get_dataset(args: argparse.Namespace, tokenizer: Any) -> list[DatasetRow]:
    """The prompts that the dataset flags in `args` describe (seeded by args.seed)."""
    rng = np.random.default_rng(args.seed)
    name = args.dataset_name
    if args.num_prompts < 1 and name != "generated-shared-prefix":
        raise DatasetError("--num-prompts must be at least 1")
    if name in ("random", "random-ids"):
        as_text = name == "random" and not getattr(args, "tokenize_prompt", False)
        rows = sample_random_requests(
            tokenizer,
            args.random_input_len,
            args.random_output_len,
            args.num_prompts,
            args.random_range_ratio,
            rng,
            return_text=as_text,
        )
    elif name == "generated-shared-prefix":
        rows = sample_generated_shared_prefix_requests(
            tokenizer,
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
            args.gsp_range_ratio,
            rng,
        )
    elif name == "sharegpt":
        rows = sample_sharegpt_requests(
            tokenizer,
            args.dataset_path,
            args.num_prompts,
            rng,
            args.sharegpt_output_len,
            args.sharegpt_context_len,
            getattr(args, "prompt_suffix", ""),
            bool(getattr(args, "apply_chat_template", False)),
        )
    else:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    if getattr(args, "apply_chat_template", False) and name != "sharegpt":
        rows = [_retext(r, apply_chat_template(tokenizer, r.prompt), tokenizer) for r in rows]
    if getattr(args, "tokenize_prompt", False):
        rows = [_to_ids(r, tokenizer) for r in rows]
    logger.info(
        "%d prompts: %d input tokens, %d output tokens",
        len(rows),
        sum(r.prompt_len for r in rows),
        sum(r.output_len for r in rows),
    )
    return rows
