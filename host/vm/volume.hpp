// `neshost run -v HOST:GUEST[:ro|rw]`: docker run's --volume spelling for a host directory (or a
// single host file) shared into the guest over virtiofs (docs/vm.md "Shares").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::vm {

/// One host directory or regular file and where the guest sees it.
struct Volume {
  std::filesystem::path host;  // absolute, symlinks resolved, an existing directory or regular file
  std::string guest;           // absolute guest path, normalised (no '.', '..', empty components)
  bool ro = false;             // `:ro`: read-only on both sides (virtiofsd --readonly + ro mount)
  bool file = false;           // `host` is a regular file (docker's file bind, e.g. /etc/hosts):
                               // bind-mounted into a staging share, then bound at `guest`
  bool operator==(const Volume&) const = default;
};

/// Checks `guest` may be a share's mount point: absolute, no '.' or '..' components, not `/`,
/// not /proc, /sys or /dev or below them (the init mounts those itself); an error says why not. A
/// `file` may be below /dev (not /dev itself): it is bound after the init's devtmpfs is mounted, as
/// kubelet's /dev/termination-log is.
host::Status check_guest_path(std::string_view guest, bool file = false);

/// Parses HOST:GUEST[:ro|rw]. HOST (relative to the current directory if not absolute) must be an
/// existing directory or regular file (`file` is then set): a missing one, a socket, a device or a
/// FIFO is an error, as is a relative or reserved GUEST or an option other than ro/rw. Errors name
/// the flag and the value (`--volume 'x': ...`).
host::Result<Volume> parse_volume(std::string_view spec);

/// Checks a set of volumes together: no GUEST path twice (the error names the path).
host::Status check_volumes(const std::vector<Volume>& v);

}  // namespace nes::vm
