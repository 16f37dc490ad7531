// Small helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "flashgla/error.h"

namespace flashgla::testing {

// Runs `call` and expects an Error of `kind` naming `argument` whose message contains `fragment`.
inline void expect_error(const std::function<void()>& call, ErrorKind kind, const std::string& argument,
                         const std::string& fragment = "") {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "expected an error naming " << argument;
}

}  // namespace flashgla::testing
