// Records for the host's tests: what a finished generation leaves on disk (host/lib/record.hpp),
// built in one line instead of field by field.
#pragma once

#include <cstdint>
#include <string>

#include "host/lib/record.hpp"

namespace nes::test {

/// Generation `gen` of `vm`, whose workload exited with `code`: exit_status = code (POSIX shell
/// convention), `reason` as given (default: the host's wording). Times left at the epoch.
inline host::Record exited_record(std::string vm, std::uint64_t gen, int code, std::string reason = {}) {
  host::Record r;
  r.vm = std::move(vm);
  r.generation = gen;
  r.outcome = proto::Outcome::exited;
  r.exit_code = static_cast<std::uint8_t>(code);
  r.exit_status = code;
  r.reason = reason.empty() ? "workload exited with code " + std::to_string(code) : std::move(reason);
  return r;
}

/// Generation `gen` of `vm`, whose workload was killed by `signal`: exit_status = 128 + signal
/// (POSIX shell convention).
inline host::Record signalled_record(std::string vm, std::uint64_t gen, int signal, std::string reason) {
  host::Record r;
  r.vm = std::move(vm);
  r.generation = gen;
  r.outcome = proto::Outcome::signalled;
  r.signal = static_cast<std::uint8_t>(signal);
  r.exit_status = 128 + signal;
  r.reason = std::move(reason);
  return r;
}

}  // namespace nes::test
