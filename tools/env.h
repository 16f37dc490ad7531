// Reading switches from the environment (for tools/tuning_env.cpp; the library reads none of these), with one
// rule: unset or empty leaves the library's choice; any other value must be one the
// switch knows, else an error names the variable (a typo must not silently measure or test the default path).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "core/errors.h"

namespace flashgla {

// A choice switch `name` whose value is `value` (nullptr: unset): "" when unset or empty, else one of `allowed`.
inline std::string env_choice(const char* name, const char* value, std::initializer_list<const char*> allowed) {
  if (value == nullptr || *value == '\0') return "";
  std::string known;
  for (const char* option : allowed) {
    if (std::strcmp(value, option) == 0) return value;
    known += (known.empty() ? "" : ", ") + std::string(option);
  }
  check::fail(ErrorKind::value, name, "must be one of " + known + " (or unset), got \"" + value + "\"");
}

// A count switch (splits, pieces): `unset` when unset or empty, else a whole number of at least `minimum`.
inline int64_t env_count(const char* name, const char* value, int64_t unset, int64_t minimum) {
  if (value == nullptr || *value == '\0') return unset;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  if (*end != '\0' || n < minimum || n > (int64_t(1) << 30))
    check::fail(ErrorKind::value, name,
                "must be a whole number >= " + std::to_string(minimum) + " (or unset), got \"" + value + "\"");
  return n;
}

}  // namespace flashgla
