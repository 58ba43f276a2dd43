"""Shared parts of the benchmark tools (radixserve.bench_serving, bench_one_batch,
bench_offline_throughput): dataset generation, HTTP request timing, serving metrics, the
machine's measured ceilings and the cost model that relates throughput to them."""
