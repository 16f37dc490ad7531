// The one error type of the API: every bad argument and every backend failure.
#pragma once

#include <stdexcept>
#include <string>

namespace flashgla {

enum class ErrorKind {
  value,        // wrong shape, size, stride or content (Python: ValueError)
  type,         // wrong dtype (Python: TypeError)
  unsupported,  // valid input this build or device cannot run (Python: NotImplementedError)
  runtime,      // a failure while running, e.g. a CUDA error (Python: RuntimeError)
};

class Error : public std::runtime_error {
 public:
  // what() reads "flashgla: <argument>: <message>" (or "flashgla: <message>" without an argument).
  Error(ErrorKind kind, std::string argument, const std::string& message);
  ErrorKind kind() const { return kind_; }
  const std::string& argument() const { return argument_; }

 private:
  ErrorKind kind_;
  std::string argument_;
};

}  // namespace flashgla
