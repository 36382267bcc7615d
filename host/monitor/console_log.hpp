// The VM console as the monitor keeps it: the kernel's and the init's own messages (the
// workload's output has a channel of its own) in STATE/VM/console.log, bounded, and with
// --console on stderr (docs/vm.md "QEMU's command line").
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "host/cli/stdio.hpp"
#include "host/lib/base.hpp"
#include "host/vm/console.hpp"

namespace nes::monitor {

/// The VM console: kept (bounded) in STATE/VM/console.log and with --console shown on stderr.
/// The serial line's CRLF becomes LF (the tty's ONLCR). Called on the launcher's drain thread
/// only; no write here can block it for long (a full stderr pipe drops console lines).
class ConsoleOut {
 public:
  bool show = false;
  static constexpr std::size_t kLogCap = 4u << 20;  // bytes of console.log
  /// Log to `f` (console.log, opened by host::open_vm_file); an empty Fd: no log.
  void open_log(host::Fd f) { log_ = std::move(f); }
  void write(std::string_view b) { emit(crlf_.feed(b)); }
  /// At the end of the console stream (QEMU has exited and its output is drained).
  void finish() { emit(crlf_.finish()); }

 private:
  void emit(const std::string& out) {
    if (out.empty()) return;
    if (show) cli::put_bounded(2, out, std::chrono::milliseconds(100));
    if (log_ && logged_ < kLogCap) {
      std::string_view part(out.data(), std::min(out.size(), kLogCap - logged_));
      bool ok = true;
      put(log_.get(), part, ok);
      logged_ += part.size();
    }
  }
  static void put(int fd, std::string_view s, bool& ok) {
    while (ok && !s.empty()) {
      ssize_t n = ::write(fd, s.data(), s.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;  // EPIPE (SIGPIPE is ignored) etc.: stop writing there, keep draining
        return;
      }
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  vm::CrlfToLf crlf_;
  host::Fd log_;
  std::size_t logged_ = 0;
};

}  // namespace nes::monitor
