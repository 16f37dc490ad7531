// Raising flashgla::Error, for the API checks and the backends alike: every
// failure names the argument it concerns and what was expected.
#pragma once

#include <string>

#include "flashgla/error.h"

namespace flashgla::check {

[[noreturn]] void fail(ErrorKind kind, const std::string& arg, const std::string& message);

// Throws unless `ok`. A macro so that the message is only built on failure:
// the checks run on every call, and building strings dominated their cost.
#define FLASHGLA_REQUIRE(ok, kind, arg, message)                       \
  do {                                                                  \
    if (!(ok)) ::flashgla::check::fail((kind), (arg), (message));       \
  } while (0)

}  // namespace flashgla::check
