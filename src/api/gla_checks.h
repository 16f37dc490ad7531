// Checks shared by the GLA ops' argument validation (gla.cpp, gla_segment.cpp).
#pragma once

#include <string>

#include "api/checks.h"
#include "core/problem.h"

namespace flashgla::check {

// The optional gate g ([B, T, H, K] vector or [B, T, H] scalar, any float
// dtype, on `dev`) and the optional sequence boundaries: sets p.gate, p.num_seqs
// and p.varlen. `lead` names the tensor whose device and sizes the others follow.
inline void gla_gate_and_sequences(GlaProblem& p, const TensorView& g, const TensorView& cu_seqlens,
                                   const TensorView& cu_seqlens_host, const Device& dev, const char* lead) {
  if (g.defined()) {
    FLASHGLA_REQUIRE(g.ndim == 3 || g.ndim == 4, ErrorKind::value, "g",
                     "expected [B, T, H, K] (vector gate) or [B, T, H] (scalar gate), got shape " + g.shape_str());
    if (g.ndim == 4) {
      shape(g, "g", {p.batch, p.seq_len, p.heads, p.key_dim}, "[B, T, H, K]");
      p.gate = GateKind::vector;
    } else {
      shape(g, "g", {p.batch, p.seq_len, p.heads}, "[B, T, H]");
      p.gate = GateKind::scalar;
    }
    floating(g, "g");
    device(g, "g", dev, lead);
  }

  p.num_seqs = p.batch;
  if (cu_seqlens.defined()) {
    FLASHGLA_REQUIRE(p.batch == 1, ErrorKind::value, "cu_seqlens",
                     "variable-length input packs all sequences into B == 1, got B = " + std::to_string(p.batch));
    p.num_seqs = check::cu_seqlens(cu_seqlens, "cu_seqlens", dev, p.seq_len, cu_seqlens_host, lead);
    p.varlen = true;
  } else {
    FLASHGLA_REQUIRE(!cu_seqlens_host.defined(), ErrorKind::value, "cu_seqlens_host", "given without cu_seqlens");
  }
}

}  // namespace flashgla::check
