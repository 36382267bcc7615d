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

namespace nes::cli {

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
  /// QMP `stop`, then the marker (durably). Ok when already paused. Error: no VMM (--sandbox),
  /// QMP's; the marker's write (the VM is resumed again: never paused unrecorded).
  host::Status pause();
  /// The marker removed, then QMP `cont`. Ok when not paused. Error: QMP's.
  host::Status resume();
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

}  // namespace nes::cli
