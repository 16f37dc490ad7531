// The flashgla command: `flashgla check` and `flashgla bench` (see --help).
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "flashgla/flashgla.h"
#include "tools/tuning_env.h"

int main(int argc, char** argv) {
  using namespace flashgla::cli;
  try {
    const CommandLine line = parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    if (line.version) {
      std::printf("flashgla %s (CUDA: %s, %d device(s) visible)\n", flashgla::version(),
#ifdef FLASHGLA_WITH_CUDA
                  "built in",
#else
                  "not built",
#endif
                  flashgla::cuda_device_count());
      return 0;
    }
    if (line.help) {
      std::fputs(help_text(line.command).c_str(), stdout);
      return 0;
    }
    Options options = line.options;
    options.tuning = {flashgla::gla_tuning_from_env(), flashgla::attention_tuning_from_env(),
                      flashgla::attention_backward_tuning_from_env()};
    return line.command == Command::check ? run_check(options) : run_bench(options);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashgla: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // The sizes passed the up-front estimate (a lower bound) but still do not fit.
    std::fprintf(stderr, "flashgla: out of host memory (std::bad_alloc) for the sizes asked for; try a smaller "
                         "-T, -B, -H, -K or -V\n");
    return 1;
  } catch (const flashgla::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // reads "flashgla: ..."
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashgla: error: %s\n", e.what());
    return 1;
  }
}
