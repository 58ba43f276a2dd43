"""Fast CPU kernels (a C++ extension of our own) behind one interface, with pure-PyTorch
fallbacks: callers use radixserve.kernels.ops and never see which one runs."""
