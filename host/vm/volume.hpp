// `neshost run -v HOST:GUEST[:ro|rw]`: docker run's --volume spelling for a host directory shared
// into the guest over virtiofs (docs/vm.md "Shares").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "host/result.hpp"

namespace nes::vm {

/// One host directory and where the guest sees it.
struct Volume {
  std::filesystem::path host;  // absolute, symlinks resolved, an existing directory
  std::string guest;           // absolute guest path, normalised (no '.', '..', empty components)
  bool ro = false;             // `:ro`: read-only on both sides (virtiofsd --readonly + ro mount)
  bool operator==(const Volume&) const = default;
};

/// Empty if `guest` may be a share's mount point: absolute, no '.' or '..' components, not `/`,
/// not /proc, /sys or /dev or below them (the init mounts those itself), else why not.
std::string guest_path_problem(std::string_view guest);

/// Parses HOST:GUEST[:ro|rw]. HOST (relative to the current directory if not absolute) must be an
/// existing directory: a missing one or a file is an error, as is a relative or reserved GUEST or
/// an option other than ro/rw. Errors name the flag and the value (`--volume 'x': ...`).
host::Result<Volume> parse_volume(std::string_view spec);

/// Checks a set of volumes together: no GUEST path twice (the error names the path).
host::Status volumes_problem(const std::vector<Volume>& v);

}  // namespace nes::vm
