"""The 20-prompt set our engine's greedy output is checked on against HF transformers."""

from __future__ import annotations

from typing import Any

VS_HF_MAX_NEW = 24

CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for sleeping better.",
    "What is 12 times 12?",
]
PLAIN_TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog",
    "Once upon a time, in a small village by the mountains, there lived",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are red, blue and",
    "In 1969, the first humans landed on the Moon. The mission was called",
    "import numpy as np\n\narr = np.arange(10)\nprint(",
    "Water boils at 100 degrees Celsius at sea level, but at higher altitudes",
    "The mitochondria is known as the powerhouse of the cell because",
    "A recipe for pancakes: mix flour, eggs and milk, then",
    "Monday, Tuesday, Wednesday, Thursday,",
    "The first law of thermodynamics states that energy cannot be",
    " ".join(["The history of the Roman Empire spans many centuries."] * 6),
]


def vs_hf_prompt_ids(tokenizer: Any) -> list[list[int]]:
    chats = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for q in CHAT_QUESTIONS
    ]
    plain = [tokenizer.encode(t) for t in PLAIN_TEXTS]
    return [list(ids) for ids in chats + plain]
