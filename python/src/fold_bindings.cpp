// flashgla._C: gla_fold_states (flashgla/gla_fold.h), the fold of context
// parallelism's per-rank state summaries, for python/flashgla/distributed.py.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_fold(nb::module_& m) {
  m.def(
      "gla_fold_states",
      [](nb::handle states, nb::handle log_decay, int64_t begin, int64_t end, bool reverse, nb::handle initial,
         bool accumulate, nb::handle out, uintptr_t stream) {
        flashgla::GlaFoldStatesArgs a;
        a.states = tensor_view_from_python(states, "states");
        a.log_decay = tensor_view_from_python(log_decay, "log_decay");
        a.begin = begin;
        a.end = end;
        a.reverse = reverse;
        a.initial = tensor_view_from_python(initial, "initial");
        a.accumulate = accumulate;
        a.out = tensor_view_from_python(out, "out");
        a.stream = as_pointer(stream);
        nb::gil_scoped_release release;
        flashgla::gla_fold_states(a);
      },
      "states"_a, "log_decay"_a, "begin"_a, "end"_a, "reverse"_a, "initial"_a.none(), "accumulate"_a, "out"_a, "stream"_a = 0,
      "out = fold of h ← diag(exp a_j) h + S_j over ranks begin..end-1 (descending when reverse).");
}
