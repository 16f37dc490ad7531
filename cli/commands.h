// The commands of the flashgla command line; each returns the exit status.
#pragma once

#include "cli/options.h"

namespace flashgla::cli {

int run_check(const Options& options);
int run_bench(const Options& options);

}  // namespace flashgla::cli
