"""stop_regex (issue 11): a request ends on the token that completes a match of one of its
patterns; the finish reason names the pattern (SGLang's FINISHED_MATCHED_REGEX) and the matched
text stays in the output, streamed or not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixserve.managers.detokenizer import IncrementalDetokenizer
from radixserve.managers.finish_checker import STOP_REGEX_MAX_WINDOW, FinishChecker
from radixserve.managers.schedule_batch import Req
from radixserve.messages import FinishReason
from radixserve.sampling.sampling_params import SamplingParams


class CharTokenizer:
    """Token id = a character's code point; id 0 is EOS."""

    eos_token_id = 0

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids if i)


def generate(text: str, **params: Any) -> tuple[str, FinishReason | None]:
    """Feed `text` one character-token at a time until the checker ends the request."""
    checker = FinishChecker([0], context_len=10_000, tokenizer=CharTokenizer())
    sp = SamplingParams.from_dict({"max_new_tokens": 1000, **params})
    req = Req(rid="r", origin_input_ids=[ord("x")], sampling_params=sp)
    for ch in text:
        req.output_ids.append(ord(ch))
        reason = checker.check(req)
        if reason is not None:
            return CharTokenizer().decode(req.output_ids), reason
    return text, None


def test_stop_regex_ends_on_the_token_that_completes_a_match() -> None:
    out, reason = generate("Answer: 42 apples. More text", stop_regex=r"\d+ [a-z]+\.")
    assert out == "Answer: 42 apples."
    assert reason is not None and reason.to_json() == {"type": "stop", "matched": r"\d+ [a-z]+\."}


def test_first_matching_pattern_wins_and_no_match_runs_on() -> None:
    out, reason = generate("abc END xyz", stop_regex=["[0-9]", "E.D"])
    assert out == "abc END" and reason == FinishReason("stop", matched="E.D")
    out, reason = generate("no digits here", stop_regex=r"\d")
    assert out == "no digits here" and reason is None


def test_stop_strings_are_checked_before_stop_regex() -> None:
    out, reason = generate("one two three", stop=["two"], stop_regex=["t[a-z]o"])
    assert out == "one two" and reason == FinishReason("stop", matched="two")


def test_unbounded_patterns_search_a_capped_window() -> None:
    out, reason = generate("x" * 50 + "<" + "y" * 100 + ">", stop_regex="<y+>")
    assert out.endswith(">") and reason == FinishReason("stop", matched="<y+>")
    # A match longer than the window is never seen whole (SGLang caps its window too).
    too_long = STOP_REGEX_MAX_WINDOW + 20
    out, reason = generate("<" + "y" * too_long + ">", stop_regex="<y+>")
    assert reason is None


def test_the_matched_text_is_kept_by_the_detokenizer() -> None:
    text = "see 42 apples."
    ids = [ord(c) for c in text]
    streamed = IncrementalDetokenizer(CharTokenizer(), stop_strings=())
    parts = [streamed.add([i], finished=False, matched_stop=None) for i in ids[:-1]]
    parts.append(streamed.add([ids[-1]], finished=True, matched_stop=r"\d+ apples\."))
    whole = IncrementalDetokenizer(CharTokenizer(), stop_strings=())
    assert "".join(parts) == whole.add(ids, finished=True, matched_stop=r"\d+ apples\.") == text
    # A pattern that is also literal text is not cut either (it is not a stop string).
    literal = IncrementalDetokenizer(CharTokenizer(), stop_strings=())
    assert literal.add([ord(c) for c in "ab END"], True, "END") == "ab END"
    cut = IncrementalDetokenizer(CharTokenizer(), stop_strings=("END",))
    assert cut.add([ord(c) for c in "ab END"], True, "END") == "ab "
