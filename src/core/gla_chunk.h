// C, the chunk length of the chunked GLA, shared by the CPU algorithm and the
// CUDA kernels (whose tiles are laid out around it: it is a property of the
// kernels, not a tuning switch).
#pragma once

namespace flashgla {

inline constexpr int kChunk = 64;  // tokens per chunk

}  // namespace flashgla
