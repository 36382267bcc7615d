// The monitor's hold on its VM's vCPUs (`neshost pause`/`unpause`, the shim's Pause/Resume): QMP
// `stop` and `cont` on the VM's QMP socket (vm::QemuSpec::qmp_socket), and the `paused` marker in
// the state dir that ps, inspect and the shim read (host/monitor/reconcile.hpp). docs/host.md
// "Pause".
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "host/lib/base.hpp"
#include "host/vm/qmp.hpp"

namespace nes::monitor {

/// One monitor's pause state of its VM and its QMP connection (connected once, reused; dropped
/// after an error). Used on the monitor's io_context thread only.
class VmPause {
 public:
  /// `qmp_socket` empty: no VMM to pause (--sandbox). `paused`: how the VM stands when this
  /// monitor takes over (a replacement: the dead monitor's marker of this generation).
  VmPause(std::filesystem::path qmp_socket, std::filesystem::path state_dir, std::string vm,
          std::uint64_t generation, bool paused);
  /// Connects to QMP now (one attempt, each read bounded by 2 s) if not yet: while the socket's
  /// path exists (a run that is not detached removes its runtime dir once the guest is ready).
  /// Error: QMP's or the socket's.
  host::Status connect();
  /// The marker (durably), then QMP `stop`. Ok when already paused. Error: no VMM (--sandbox),
  /// the marker's write, QMP's (the marker removed again).
  host::Status pause();
  /// QMP `cont`, then the marker removed. Ok when not paused. Error: QMP's (still paused), the
  /// marker's removal (running; a stale marker a replacement resumes through).
  host::Status resume();
  /// Whether this monitor holds the VM paused.
  bool paused() const { return paused_; }
  /// The VM has ended: its marker goes (a later generation never reads it as its own anyway).
  void ended();

 private:
  std::filesystem::path qmp_socket_, state_dir_;
  std::string vm_;
  std::uint64_t generation_;
  bool paused_;
  std::optional<vm::Qmp> qmp_;
};

}  // namespace nes::monitor
