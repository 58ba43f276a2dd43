// Where the AMX GGUF matmul (gguf_gemm_amx.cpp) puts a tile row of results: float32, bfloat16
// rounded as it is written, or only each row's running argmax (row_argmax.h).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "row_argmax.h"

namespace radixserve {

// Where a call's [m, n] results go: float32, or bfloat16 when x is (rounded here, as the tile
// row is written, instead of by a separate pass over the float32 result), or, for a greedy
// batch's LM head, only each row's argmax over those bfloat16 results (row_argmax.h).
struct Output {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  RowArgmax* argmax = nullptr;
  int64_t n = 0;  // the row stride of f32 / bf16
};

// `count` (<= 16) results of row `row` from column `col`. bfloat16: rounded to nearest even as
// at::Tensor::to and c10 round (NaN -> 0x7FC0), the same bits as converting the float32 result
// afterwards; the argmax sees those rounded values.
inline void store_row(const Output& out, int64_t row, int64_t col, const float* src, int count) {
  if (out.f32 != nullptr) {
    std::memcpy(out.f32 + row * out.n + col, src, count * sizeof(float));
    return;
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  const __m512i bits = _mm512_maskz_loadu_epi32(mask, src);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(bits),
                                           _mm512_castsi512_ps(bits), _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  if (out.argmax != nullptr) {
    out.argmax->add(row, col, _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)), mask);
    return;
  }
  _mm256_mask_storeu_epi16(out.bf16 + row * out.n + col, mask, _mm512_cvtepi32_epi16(r));
}

}  // namespace radixserve
#endif
