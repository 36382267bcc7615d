// A client of QMP, QEMU's JSON control protocol, on a Unix socket (`-qmp unix:PATH,server=on`):
// any command with JSON arguments and, optionally, a descriptor (SCM_RIGHTS): stop and cont for
// `neshost pause`/`unpause` and the shim's Pause/Resume (docs/vm.md "Pause"), a snapshot's save,
// load and hot-plugs (host/vm/snapshot.hpp). Blocking, each wait bounded (QEMU answers these at
// once from its main loop); each request carries an id, so a late answer to one that timed out
// is never taken for the next's; QMP's asynchronous events are read and skipped.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/fd.hpp"
#include "host/lib/base.hpp"

namespace nes::vm {

/// One QMP connection in command mode. Move-only (owns the socket).
class Qmp {
 public:
  /// Connects (retrying while QEMU has not yet made the socket, until `within` has passed; 0: one
  /// attempt), reads QEMU's greeting and enters command mode (qmp_capabilities), each read
  /// bounded by `within` plus 1 s. Error: the socket never accepted, or the greeting was not QMP's.
  static host::Result<Qmp> connect(const std::filesystem::path& socket, std::chrono::milliseconds within);

  /// Runs `command` with `arguments_json` (a JSON object, or empty for none) and returns the
  /// `return` member's JSON text. Error: QMP's own `error` (its class and desc), a reply longer
  /// than 1 MiB, the socket closed, or no reply within `within`.
  /// `pass_fd` >= 0: that descriptor goes with the request (SCM_RIGHTS), as QMP's `getfd` and
  /// `add-fd` take one; not consumed.
  host::Result<std::string> execute(std::string_view command, std::string_view arguments_json,
                                    std::chrono::milliseconds within, int pass_fd = -1);

  /// QEMU's version as its greeting says it ("7.2.0").
  const std::string& qemu_version() const { return version_; }

 private:
  explicit Qmp(base::Fd fd) : fd_(std::move(fd)) {}
  host::Result<std::string> read_line(std::chrono::steady_clock::time_point deadline);
  base::Fd fd_;
  std::string buf_, version_;
  std::uint64_t next_id_ = 1;
};

}  // namespace nes::vm
