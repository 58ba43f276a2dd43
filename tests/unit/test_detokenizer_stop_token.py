"""The detokenizer leaves a matched stop token out of the text (SGLang's trim_matched_stop)."""

from __future__ import annotations

from radixserve.managers.detokenizer import IncrementalDetokenizer
from tests.unit.test_http_fakes import EOS, FakeTokenizer


def test_a_matched_stop_token_is_left_out_of_the_text_unless_no_stop_trim() -> None:
    # SGLang's rule: output_ids keep the stop token, the text does not (it shows only with
    # skip_special_tokens off, e.g. gpt-oss's `<|return|>` for the harmony parsers).
    tok = FakeTokenizer()
    ids = tok.encode("ok", add_special_tokens=False) + [EOS]
    trimmed = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert trimmed.add(ids, finished=True, matched_stop=EOS) == "ok"
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False, no_stop_trim=True)
    assert kept.add(ids, finished=True, matched_stop=EOS) == "ok</s>"
