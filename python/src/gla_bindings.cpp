// flashgla._C: GLA (flashgla/gla.h, gla_normalize.h, gla_fold.h) for the ops in
// python/flashgla/ops/gla.py and the context parallelism of flashgla/distributed.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace flashgla_python {

using namespace nb::literals;
using namespace flashgla;

namespace {

// The inputs GlaForwardArgs and GlaBackwardArgs share.
template <class Args>
nb::class_<Args> gla_args_class(nb::module_& m, const char* name, const char* doc) {
  nb::class_<Args> cls(m, name, doc);
  cls.def(nb::init<>())
      .def_rw("scale", &Args::scale)
      .def_rw("algorithm", &Args::algorithm)
      .def_rw("reverse", &Args::reverse)
      .def_rw("state_v_first", &Args::state_v_first);
  tensor_fields<Args>(cls, {{"q", &Args::q},
                            {"k", &Args::k},
                            {"v", &Args::v},
                            {"g", &Args::g},
                            {"initial_state", &Args::initial_state},
                            {"cu_seqlens", &Args::cu_seqlens},
                            {"cu_seqlens_host", &Args::cu_seqlens_host},
                            {"g_gamma", &Args::g_gamma},
                            {"summary", &Args::summary},
                            {"intra", &Args::intra}});
  cls.def_rw("phase", &Args::phase);
  stream_field(cls);
  workspace_fields(cls);
  return cls;
}

// GlaPhase (flashgla/gla.h): whether a call may run in two, and the bytes of the workspace the two share.
template <class Args>
void phase_queries(nb::module_& m, const char* applies_name, bool (*applies)(const Args&), const char* bytes_name,
                   size_t (*bytes)(const Args&)) {
  m.def(applies_name, [applies](const Args& a) { return applies(with_tuning(a, &gla_tuning_from_env)); }, "args"_a);
  m.def(bytes_name, [bytes](const Args& a) { return bytes(with_tuning(a, &gla_tuning_from_env)); }, "args"_a);
}

}  // namespace

void bind_gla(nb::module_& m) {
  nb::enum_<GlaAlgorithm>(m, "GlaAlgorithm")
      .value("chunked", GlaAlgorithm::chunked)
      .value("recurrent", GlaAlgorithm::recurrent);
  nb::enum_<GlaPhase>(m, "GlaPhase")
      .value("whole", GlaPhase::whole)
      .value("summary", GlaPhase::summary)
      .value("output", GlaPhase::output);

  auto forward = gla_args_class<GlaForwardArgs>(m, "GlaForwardArgs", "flashgla::GlaForwardArgs (flashgla/gla.h).");
  tensor_fields<GlaForwardArgs>(forward, {{"o", &GlaForwardArgs::o},
                                          {"final_state", &GlaForwardArgs::final_state},
                                          {"initial_state_indices", &GlaForwardArgs::initial_state_indices},
                                          {"final_state_indices", &GlaForwardArgs::final_state_indices},
                                          {"ssm_state_indices", &GlaForwardArgs::ssm_state_indices},
                                          {"num_accepted_tokens", &GlaForwardArgs::num_accepted_tokens},
                                          {"z_init", &GlaForwardArgs::z_init},
                                          {"z_final", &GlaForwardArgs::z_final},
                                          {"norm_den", &GlaForwardArgs::norm_den},
                                          {"norm_chunk_z", &GlaForwardArgs::norm_chunk_z}});
  forward.def_rw("inplace_final_state", &GlaForwardArgs::inplace_final_state)
      .def_rw("normalize", &GlaForwardArgs::normalize);
  m.def(
      "gla_forward",
      [](const GlaForwardArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_forward, with_tuning(a, &gla_tuning_from_env), allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none(),
      "allocate_workspace: bytes -> (buffer, data_ptr), or None on the CPU (see WorkspaceAllocator).");
  phase_queries(m, "gla_forward_phases_apply", &flashgla::gla_forward_phases_apply, "gla_forward_workspace_bytes",
                &flashgla::gla_forward_workspace_bytes);
  m.def(
      "gla_normalize_residual_slots",
      [](const GlaForwardArgs& a) {
        return flashgla::gla_normalize_residual_slots(with_tuning(a, &gla_tuning_from_env));
      },
      "args"_a, "S > 0 where gla_backward folds the normaliser in with the forward's residuals (flashgla/gla.h).");
  m.attr("GLA_INTRA_COLUMNS") = flashgla::kIntraColumns;
  m.def("gla_forward_saves_intra", &flashgla::gla_forward_saves_intra, "args"_a,
        "Whether the forward writes intra, the chunks' scores A, for its backward (flashgla/gla.h).");

  auto backward =
      gla_args_class<GlaBackwardArgs>(m, "GlaBackwardArgs", "flashgla::GlaBackwardArgs (flashgla/gla.h).");
  tensor_fields<GlaBackwardArgs>(backward, {{"d_o", &GlaBackwardArgs::d_o},
                                            {"d_final_state", &GlaBackwardArgs::d_final_state},
                                            {"dq", &GlaBackwardArgs::dq},
                                            {"dk", &GlaBackwardArgs::dk},
                                            {"dv", &GlaBackwardArgs::dv},
                                            {"dg", &GlaBackwardArgs::dg},
                                            {"d_initial_state", &GlaBackwardArgs::d_initial_state},
                                            {"d_g_gamma", &GlaBackwardArgs::d_g_gamma},
                                            {"norm_o", &GlaBackwardArgs::norm_o},
                                            {"norm_den", &GlaBackwardArgs::norm_den},
                                            {"norm_chunk_z", &GlaBackwardArgs::norm_chunk_z},
                                            {"d_z_final", &GlaBackwardArgs::d_z_final},
                                            {"d_z_init", &GlaBackwardArgs::d_z_init}});
  m.def(
      "gla_backward",
      [](const GlaBackwardArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_backward, with_tuning(a, &gla_tuning_from_env), allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());
  phase_queries(m, "gla_backward_phases_apply", &flashgla::gla_backward_phases_apply, "gla_backward_workspace_bytes",
                &flashgla::gla_backward_workspace_bytes);

  nb::class_<GlaDecodeArgs> decode(m, "GlaDecodeArgs", "flashgla::GlaDecodeArgs (flashgla/gla.h).");
  decode.def(nb::init<>()).def_rw("scale", &GlaDecodeArgs::scale);
  tensor_fields<GlaDecodeArgs>(decode, {{"q", &GlaDecodeArgs::q},
                                        {"k", &GlaDecodeArgs::k},
                                        {"v", &GlaDecodeArgs::v},
                                        {"g", &GlaDecodeArgs::g},
                                        {"state", &GlaDecodeArgs::state},
                                        {"state_indices", &GlaDecodeArgs::state_indices},
                                        {"o", &GlaDecodeArgs::o},
                                        {"token_states", &GlaDecodeArgs::token_states}});
  stream_field(decode);
  m.def(
      "gla_decode", [](const GlaDecodeArgs& a) { run_without_gil(&flashgla::gla_decode, a); }, "args"_a);

  // The linear-attention normaliser (flashgla/gla_normalize.h).
  nb::class_<GlaNormalizeArgs> normalize(m, "GlaNormalizeArgs",
                                         "flashgla::GlaNormalizeArgs (flashgla/gla_normalize.h).");
  normalize.def(nb::init<>()).def_rw("scale", &GlaNormalizeArgs::scale).def_rw("reverse", &GlaNormalizeArgs::reverse);
  tensor_fields<GlaNormalizeArgs>(normalize, {{"o_raw", &GlaNormalizeArgs::o_raw},
                                              {"q", &GlaNormalizeArgs::q},
                                              {"k", &GlaNormalizeArgs::k},
                                              {"z_init", &GlaNormalizeArgs::z_init},
                                              {"cu_seqlens", &GlaNormalizeArgs::cu_seqlens},
                                              {"cu_seqlens_host", &GlaNormalizeArgs::cu_seqlens_host},
                                              {"o", &GlaNormalizeArgs::o},
                                              {"z_final", &GlaNormalizeArgs::z_final}});
  stream_field(normalize);
  m.def(
      "gla_normalize_forward",
      [](const GlaNormalizeArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_normalize_forward, a, allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  using NormalizeBackward = GlaNormalizeBackwardArgs;
  nb::class_<NormalizeBackward> normalize_backward(
      m, "GlaNormalizeBackwardArgs", "flashgla::GlaNormalizeBackwardArgs (flashgla/gla_normalize.h).");
  normalize_backward.def(nb::init<>())
      .def_rw("scale", &NormalizeBackward::scale)
      .def_rw("reverse", &NormalizeBackward::reverse)
      .def_rw("o_raw_is_output", &NormalizeBackward::o_raw_is_output);
  tensor_fields<NormalizeBackward>(normalize_backward, {{"o_raw", &NormalizeBackward::o_raw},
                                                        {"q", &NormalizeBackward::q},
                                                        {"k", &NormalizeBackward::k},
                                                        {"z_init", &NormalizeBackward::z_init},
                                                        {"cu_seqlens", &NormalizeBackward::cu_seqlens},
                                                        {"cu_seqlens_host", &NormalizeBackward::cu_seqlens_host},
                                                        {"d_o", &NormalizeBackward::d_o},
                                                        {"d_z_final", &NormalizeBackward::d_z_final},
                                                        {"d_o_raw", &NormalizeBackward::d_o_raw},
                                                        {"dq", &NormalizeBackward::dq},
                                                        {"dk", &NormalizeBackward::dk},
                                                        {"d_z_init", &NormalizeBackward::d_z_init}});
  stream_field(normalize_backward);
  m.def(
      "gla_normalize_backward",
      [](const NormalizeBackward& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_normalize_backward, a, allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  // Per-segment summaries (context parallelism's pre-pass).
  nb::class_<GlaSegmentStatesArgs> states(m, "GlaSegmentStatesArgs",
                                          "flashgla::GlaSegmentStatesArgs (flashgla/gla.h).");
  states.def(nb::init<>());
  tensor_fields<GlaSegmentStatesArgs>(states, {{"k", &GlaSegmentStatesArgs::k},
                                               {"v", &GlaSegmentStatesArgs::v},
                                               {"g", &GlaSegmentStatesArgs::g},
                                               {"g_gamma", &GlaSegmentStatesArgs::g_gamma},
                                               {"cu_seqlens", &GlaSegmentStatesArgs::cu_seqlens},
                                               {"cu_seqlens_host", &GlaSegmentStatesArgs::cu_seqlens_host},
                                               {"states", &GlaSegmentStatesArgs::states},
                                               {"log_decay", &GlaSegmentStatesArgs::log_decay}});
  stream_field(states);
  m.def(
      "gla_segment_states",
      [](const GlaSegmentStatesArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_segment_states, with_tuning(a, &gla_tuning_from_env),
                           allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  nb::class_<GlaSegmentStateGradsArgs> grads(m, "GlaSegmentStateGradsArgs",
                                             "flashgla::GlaSegmentStateGradsArgs (flashgla/gla.h).");
  grads.def(nb::init<>()).def_rw("scale", &GlaSegmentStateGradsArgs::scale);
  tensor_fields<GlaSegmentStateGradsArgs>(grads, {{"q", &GlaSegmentStateGradsArgs::q},
                                                  {"d_o", &GlaSegmentStateGradsArgs::d_o},
                                                  {"g", &GlaSegmentStateGradsArgs::g},
                                                  {"g_gamma", &GlaSegmentStateGradsArgs::g_gamma},
                                                  {"cu_seqlens", &GlaSegmentStateGradsArgs::cu_seqlens},
                                                  {"cu_seqlens_host", &GlaSegmentStateGradsArgs::cu_seqlens_host},
                                                  {"d_states", &GlaSegmentStateGradsArgs::d_states}});
  stream_field(grads);
  m.def(
      "gla_segment_state_grads",
      [](const GlaSegmentStateGradsArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::gla_segment_state_grads, with_tuning(a, &gla_tuning_from_env),
                           allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  // The fold of context parallelism's per-rank summaries (flashgla/gla_fold.h).
  nb::class_<GlaFoldStatesArgs> fold(m, "GlaFoldStatesArgs", "flashgla::GlaFoldStatesArgs (flashgla/gla_fold.h).");
  fold.def(nb::init<>())
      .def_rw("begin", &GlaFoldStatesArgs::begin)
      .def_rw("end", &GlaFoldStatesArgs::end)
      .def_rw("reverse", &GlaFoldStatesArgs::reverse)
      .def_rw("accumulate", &GlaFoldStatesArgs::accumulate);
  tensor_fields<GlaFoldStatesArgs>(fold, {{"states", &GlaFoldStatesArgs::states},
                                          {"log_decay", &GlaFoldStatesArgs::log_decay},
                                          {"initial", &GlaFoldStatesArgs::initial},
                                          {"out", &GlaFoldStatesArgs::out}});
  stream_field(fold);
  m.def(
      "gla_fold_states", [](const GlaFoldStatesArgs& a) { run_without_gil(&flashgla::gla_fold_states, a); },
      "args"_a,
      "out = fold of h <- diag(exp a_j) h + S_j over ranks begin..end-1 (descending when reverse).");
}

}  // namespace flashgla_python
