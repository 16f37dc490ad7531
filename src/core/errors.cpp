#include "core/errors.h"

namespace flashgla::check {

void fail(ErrorKind kind, const std::string& arg, const std::string& message) { throw Error(kind, arg, message); }

}  // namespace flashgla::check
