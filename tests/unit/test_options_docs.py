"""docs/options.md is generated from the option specs and must not drift from them."""

from __future__ import annotations

from pathlib import Path

from radixserve.options.docs import render_markdown
from radixserve.options.registry import all_options, areas
from radixserve.options.spec import Support

DOCS = Path(__file__).resolve().parents[2] / "docs" / "options.md"


def test_docs_options_md_is_up_to_date() -> None:
    assert DOCS.read_text(encoding="utf-8") == render_markdown(), (
        "docs/options.md is stale: run `python -m radixserve.options.docs > docs/options.md`"
    )


def test_docs_list_every_visible_option_with_its_support_level() -> None:
    text = render_markdown()
    for area in areas():
        assert f"\n## {area}\n" in text
    for spec in all_options():
        if spec.hidden:
            continue
        row = next(line for line in text.splitlines() if line.startswith(f"| `{spec.name}`"))
        assert spec.support.value in row, spec.name


def test_support_table_is_honest_about_key_options() -> None:
    levels = {spec.name: spec.support for spec in all_options()}
    assert levels["--mem-fraction-static"] is Support.IMPLEMENTED
    assert levels["--cuda-graph-max-bs-decode"] is Support.NOT_APPLICABLE
    assert levels["--cuda-graph-max-bs"] is Support.NOT_APPLICABLE
    # On the CPU the decode batch-size list is --enable-torch-compile's buckets.
    assert levels["--cuda-graph-bs-decode"] is Support.IMPLEMENTED
    assert levels["--enable-torch-compile"] is Support.IMPLEMENTED
    assert levels["--enable-nccl-nvls"] is Support.NOT_APPLICABLE
    assert levels["--lora-paths"] is Support.IMPLEMENTED
    assert levels["--enable-lora-overlap-loading"] is Support.UNSUPPORTED
    assert levels["--speculative-algorithm"] is Support.IMPLEMENTED
    assert levels["--speculative-eagle-topk"] is Support.IMPLEMENTED
    assert levels["--speculative-token-map"] is Support.IMPLEMENTED
    assert levels["--speculative-dflash-block-size"] is Support.UNSUPPORTED
    assert levels["--disaggregation-mode"] is Support.IMPLEMENTED
    assert levels["--disaggregation-decode-enable-offload-kvcache"] is Support.UNSUPPORTED
    assert levels["--enable-hierarchical-cache"] is Support.IMPLEMENTED
    assert levels["--hicache-io-backend"] is Support.NOT_APPLICABLE
    # A deprecated spelling is as supported as the option it stands for.
    assert levels["--stream-output"] is levels["--incremental-streaming-output"]
