"""Multi-LoRA serving: adapter specs and loading (PEFT folders), and the scheduler-side
manager that places adapters in the batch's device slots. The per-layer arithmetic lives in
radixserve.layers.lora."""
