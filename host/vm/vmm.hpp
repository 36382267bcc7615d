// The VMM of one VM, as its monitor drives it: QEMU (or --sandbox's unshare) started from the
// plan (Vmm::boot), started paused and loaded from a snapshot (Vmm::restore), or taken over from a
// dead monitor (Vmm::adopt). Firecracker's split between its builder (a VM from a config) and its
// persist path (a VM from a snapshot), with the run's own session kept outside: a Vmm knows
// nothing of the Host, it only starts, watches and ends the process (docs/vm.md "The QEMU
// process", "Snapshots").
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "host/lib/base.hpp"
#include "host/vm/process.hpp"
#include "host/vm/snapshot.hpp"

namespace nes::vm {

/// What a start of the VMM needs, booted or restored alike.
struct VmmLaunch {
  std::vector<std::string> argv;  // QEMU's (vm::qemu_argv) or --sandbox's command
  ByteSink console;               // its stdout: the guest's serial console, on the drain thread
  ByteSink diagnostics;           // its stderr: QEMU's own warnings and errors
  /// Set: the VMM outlives its monitor (no death signal) and this gate records its identity
  /// durably before it may exec (LaunchOptions::before_exec). Empty: it dies with us.
  std::function<host::Status(pid_t)> gate;
  int netns_fd = -1;  // --network netns: QEMU runs in that namespace (LaunchOptions::netns_fd)
  /// Descriptors it inherits at fixed numbers (LaunchOptions::fds; ours stay open).
  std::vector<std::pair<int, int>> fds;
};

/// What a restore loads into the QEMU it started paused (`-S -incoming defer`) before the guest
/// runs: the snapshot's device state, then the shares and the NIC plugged in, then `cont`.
struct VmmRestore {
  std::filesystem::path qmp_socket;  // QemuSpec::qmp_socket
  std::string qemu_version;          // the snapshot's (SnapshotMeta::qemu_version): another is refused
  const host::Fd* state = nullptr;   // state.qemu, opened and checked (vm::open_snapshot)
  std::vector<FsDevice> shares;      // each on the hot-plug port of its index
  std::optional<std::string> nic;    // its device_add arguments (host::qmp_nic_device)
  /// How a refusal of the snapshot itself (another QEMU, a state QEMU cannot load) is worded,
  /// e.g. "--snapshot base: ..." with how to make it again (cli's snapshot_refusal()).
  std::function<host::Error(host::Error)> refuse;
};

/// One VM's VMM process, watched on an io_context. Not copyable or movable (its watch points at
/// it). Destroying it drops the watch; a launched process that still runs is killed with it
/// (VmProcess's destructor), an adopted one is left running (stop() ends either on purpose).
class Vmm {
 public:
  /// How long restore() waits for QEMU to load a snapshot's state.
  static constexpr std::chrono::milliseconds kSnapshotLoadWait{60000};

  /// Starts the VMM from `launch`. Error: "cannot start QEMU: WHY" (the program, a gate that
  /// failed, a bad fd: VmProcess::launch's).
  static host::Result<std::unique_ptr<Vmm>> boot(boost::asio::io_context& io, VmmLaunch launch);
  /// Starts QEMU paused and loads `restore` into it (each QMP step bounded, the load by
  /// kSnapshotLoadWait), then lets the guest run; QEMU's warning about the NIC backend that waits
  /// for its device is dropped from `diagnostics`. Errors: as boot(); a refusal of the snapshot
  /// as `restore.refuse` words it ("--snapshot GIVEN: ..."); any other, "--snapshot: WHY". A
  /// failed restore leaves no QEMU: it is ended (SIGTERM, 200 ms, SIGKILL) and its output drained.
  static host::Result<std::unique_ptr<Vmm>> restore(boost::asio::io_context& io, VmmLaunch launch,
                                                    const VmmRestore& restore);
  /// A replacement monitor's: the VMM it took over (VmProcess::adopt).
  static std::unique_ptr<Vmm> adopt(boost::asio::io_context& io, std::unique_ptr<VmProcess> process);

  struct Key {  // passkey: only the named constructors above make one
    explicit Key() = default;
  };
  Vmm(Key, boost::asio::io_context& io, std::unique_ptr<VmProcess> p) : io_(io), process_(std::move(p)) {}
  Vmm(const Vmm&) = delete;
  Vmm& operator=(const Vmm&) = delete;

  /// Calls `exited` once, on the io_context, when the process has exited: reaped (its status,
  /// if ours: nullopt for an adopted one or one reaped elsewhere) and its output drained (bounded,
  /// 2 s), so every console line precedes it. Not called once stop_watching() ran.
  void watch_exit(std::function<void(std::optional<ProcessExit>)> exited);
  /// Waits up to `timeout` for the process to exit; true if it has.
  bool exited_within(std::chrono::milliseconds timeout) { return process_->wait_for(timeout).has_value(); }
  /// SIGKILL (the session's destroy hook); the exit watch reports the exit.
  void kill() { process_->signal(SIGKILL); }
  /// Whatever happened: the process is gone (SIGTERM, 1 s, SIGKILL if it still runs) and its
  /// output drained (bounded, 2 s).
  void stop();
  /// Drops the exit watch (after stop()).
  void stop_watching() { exit_watch_.reset(); }
  pid_t pid() const { return process_->pid(); }

 private:
  boost::asio::io_context& io_;
  std::unique_ptr<VmProcess> process_;
  std::optional<boost::asio::posix::stream_descriptor> exit_watch_;
};

}  // namespace nes::vm
