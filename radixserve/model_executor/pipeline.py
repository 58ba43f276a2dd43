"""One rank's part of a forward step under pipeline parallelism (--pp-size).

Every rank gets the same step from rank 0 (managers/tp_sync.py) and splits it into the same
micro-batches (--pp-max-micro-batch-size requests each; by default the batch in pp-size parts).
For each micro-batch in turn a stage receives the hidden states and residual from the previous
stage (stage 0 embeds the tokens instead), runs its decoder layers, and sends the result on
without waiting for it to be received; so while stage k runs micro-batch i, stage k + 1 runs
micro-batch i - 1 (fill and drain within one scheduler step). The last stage applies the final
norm and the LM head, and its TP rank 0 sends each micro-batch's logits rows (and embedding
rows) to rank 0, which puts them back in the step's order for the scheduler to sample from.

The transport is torch.distributed point-to-point (send/recv over gloo on the CPU, NCCL on
CUDA); shapes need no messages of their own because every rank knows the step.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.pipeline_layout import PipelineLayout
from radixserve.model_executor.micro_batch import MicroBatch, split_step

if TYPE_CHECKING:
    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.model_executor.step_io import ForwardOutput, StepInputs

logger = logging.getLogger(__name__)


class PipelineExecutor:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.layout = PipelineLayout(ps.get_tp_size(), ps.get_pp_size())
        self.rank = dist.get_rank()
        self.stage = runner.model.model.stage
        self.next_rank = self.layout.next_rank(self.rank)
        self.prev_rank = self.layout.prev_rank(self.rank)
        self.sends_logits = self.rank == self.layout.logits_sender
        cfg = runner.model_config
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.max_micro_batch: int | None = runner.server_args.pp_max_micro_batch_size
        logger.info(
            "Pipeline stage %d of %d: decoder layers %d-%d of %d%s%s",
            ps.get_pp_rank(),
            self.layout.pp_size,
            self.stage.layers.start,
            self.stage.layers.stop - 1,
            self.stage.num_layers,
            ", the embedding" if self.stage.first else "",
            ", the final norm and LM head" if self.stage.last else "",
        )

    def micro_batch_size(self, num_reqs: int) -> int:
        """--pp-max-micro-batch-size, else the batch in pp-size near-equal parts (so every
        stage has work once the pipeline is full)."""
        return self.max_micro_batch or max(1, math.ceil(num_reqs / self.layout.pp_size))

    def forward(self, step: StepInputs, req_to_token: torch.Tensor) -> ForwardOutput:
        from radixserve.model_executor.step_io import ForwardOutput

        parts = split_step(step, self.micro_batch_size(len(step.extend_lens)))
        pending: list[tuple[Any, torch.Tensor]] = []  # sends in flight, with their buffers
        for part in parts:
            self._run_stage(part, req_to_token, pending)
        if self.rank == 0:
            output = self._gather_outputs(step, parts)
        else:
            output = ForwardOutput(torch.empty(0, self.vocab_size, device=self.runner.device), None)
        for work, _ in pending:
            work.wait()
        return output

    def _run_stage(
        self, part: MicroBatch, req_to_token: torch.Tensor, pending: list[tuple[Any, torch.Tensor]]
    ) -> None:
        runner = self.runner
        body = runner.model.model
        fb = runner.forward_batch(part.step, req_to_token)
        residual: torch.Tensor | None
        if self.stage.first:
            hidden, residual = body.embed(fb.input_ids), None
        else:
            assert self.prev_rank is not None
            received = torch.empty(
                (2, fb.num_tokens, self.hidden_size), dtype=runner.dtype, device=runner.device
            )
            dist.recv(received, src=self.prev_rank)
            hidden, residual = received[0], received[1]
        rope_rows = body.rotary_emb.table_rows(fb.positions, fb)  # as LlamaModel.forward
        for i in self.stage.layers:
            hidden, residual = body.layers[i](rope_rows, hidden, residual, fb)
        assert residual is not None  # every stage runs at least one layer
        if not self.stage.last:
            assert self.next_rank is not None
            out = torch.stack([hidden, residual])
            pending.append((dist.isend(out, dst=self.next_rank), out))
            return
        hidden, _ = body.norm(hidden, residual)
        # Every TP rank of the last stage takes part in the LM head's all-gather.
        logits = runner.model.compute_logits(hidden[fb.logits_indices]).float()
        if not self.sends_logits:
            return
        if len(part.logits_at):
            pending.append((dist.isend(logits.contiguous(), dst=0), logits))
        if part.step.hidden_rows:
            rows = torch.tensor(part.step.hidden_rows, dtype=torch.int64, device=runner.device)
            pooled = hidden[rows].float().contiguous()
            pending.append((dist.isend(pooled, dst=0), pooled))

    def _gather_outputs(self, step: StepInputs, parts: list[MicroBatch]) -> ForwardOutput:
        """On rank 0: every micro-batch's logits (and embedding) rows from the last stage, in
        the step's order."""
        from radixserve.model_executor.step_io import ForwardOutput

        src = self.layout.logits_sender
        device = self.runner.device
        logits = torch.empty(
            len(step.logits_rows), self.vocab_size, device=device, dtype=torch.float32
        )
        hidden = None
        if step.hidden_rows:
            hidden = torch.empty(
                len(step.hidden_rows), self.hidden_size, device=device, dtype=torch.float32
            )
        for part in parts:
            if part.logits_at:
                rows = torch.empty(
                    len(part.logits_at), self.vocab_size, device=device, dtype=torch.float32
                )
                dist.recv(rows, src=src)
                logits[list(part.logits_at)] = rows
            if part.hidden_at and hidden is not None:
                rows = torch.empty(
                    len(part.hidden_at), self.hidden_size, device=device, dtype=torch.float32
                )
                dist.recv(rows, src=src)
                hidden[list(part.hidden_at)] = rows
        return ForwardOutput(logits, hidden)
