// The shim's durable writes: the task's record, a Delete's receipt, the exec journal. Each backs
// an answer (docs/containerd.md "A shim killed mid-call", "Durable writes"): the call that needs
// one fails when it fails, and nothing it would announce is announced.
#pragma once

#include <filesystem>
#include <string_view>

#include "host/lib/base.hpp"

namespace nes::shim {

/// host::write_durable(dir, name, bytes) behind the fault point "eio:" + `point`
/// (fault_point.hpp fault_errno). Errors name the file and the errno (`write DIR/NAME:
/// Input/output error`), as write_durable's do.
host::Status write_durable_at(std::string_view point, const std::filesystem::path& dir, std::string_view name,
                              std::string_view bytes);

}  // namespace nes::shim
