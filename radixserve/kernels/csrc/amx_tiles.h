// What every AMX kernel needs before its first tile instruction: the OS's permission to use the
// tile state (asked once per process) and a tile configuration. Shared by the AMX-INT8 K-quant
// panel GEMM (gguf_q8k_amx.cpp) and the AMX-BF16 Q4_1/Q8_0 GEMM (gguf_gemm_amx.cpp).
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#if defined(__AMX_TILE__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace amx {

// Linux hands out the tile registers' state (XTILEDATA, 8 KiB per thread) only to processes
// that ask for it; without it the first tile instruction faults. Asked once, answer kept.
inline bool tile_state_permitted() {
#if defined(__AMX_TILE__) && defined(__linux__)
  static const bool permitted = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
#else
  return false;
#endif
}

#if defined(__AMX_TILE__)
// The 64-byte operand of LDTILECFG (palette 1).
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// All eight tiles as 16 rows of 64 bytes (the largest shape): both kernels use only that one.
// Per thread, and again per call: other code may configure the tiles in between.
inline void configure_full_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
#endif

}  // namespace amx
}  // namespace radixserve
