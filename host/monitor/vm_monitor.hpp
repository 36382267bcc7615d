// The monitor of one VM: the process that serves a `neshost run` VM from its start to its end
// (in the foreground, or detached with -d), or takes a detached one over from a dead monitor
// (`neshost monitor`). It carries the run's plan out (the boot files, passt, STATE/VM, the share
// daemons, the VMM: vm::Vmm), serves the session (serve_vm with the VMM as the embedder's), the
// workload's stdio on ours, the control socket, pause/resume, and ends everything in order
// (docs/host.md "Detached VMs", "Re-adoption"; docs/vm.md "`neshost run`"). One concern per file:
// monitor_run.cpp (the two entries, the serve loop and its end), monitor_stdio.cpp (our
// stdin/stdout/stderr and the terminal), monitor_control.cpp (the control requests),
// monitor_vmm.cpp (the VMM and its daemons' deaths), monitor_events.cpp (the session's events),
// takeover.cpp (`neshost monitor`).
#pragma once

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/cli/cli.hpp"
#include "host/cli/exec.hpp"
#include "host/cli/plan.hpp"
#include "host/cli/stdio.hpp"
#include "host/cli/terminal.hpp"
#include "host/lib/base.hpp"
#include "host/lib/host.hpp"
#include "host/lib/record.hpp"
#include "host/monitor/daemon_watch.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/pause.hpp"
#include "host/monitor/vm_state.hpp"
#include "host/vm/snapshot.hpp"
#include "host/vm/vmm.hpp"

namespace nes::monitor {

/// What `neshost run` hands its monitor besides the plan.
struct RunStart {
  int netns_fd = -1;  // --network netns: the namespace QEMU runs in (the caller's attachment owns it)
  std::optional<vm::OpenSnapshot> snapshot;  // --snapshot: its files, opened and checked
  host::Fd started_notify;                   // -d: the creator's pipe (notify_started)
  bool detached = false;                     // -d: a VM whose workload never started is kept (--rm)
};

/// One VM's monitor. Lives on the stack of Monitor::run() or Monitor::take_over(); every callback
/// it hands the session, the control socket and the VMM's watches is one of its members.
class Monitor {
 public:
  /// `neshost run`'s monitor: carries `plan` out (the boot files, passt, STATE/VM and the
  /// generation, the share daemons, the VMM) and serves the VM to its end; --rm removes its state
  /// then (with -d not for a workload that never started: its creator reads why). Returns the
  /// exit status (125 with one line on stderr when a step before the VM fails).
  static int run(cli::RunPlan& plan, cli::RuntimeDir& rt, RunStart start);
  /// `neshost monitor`: takes over detached VM `vm` of `state` whose monitor is gone while its VMM
  /// runs (host::VmState::orphaned()), and serves it to its end as the monitor gone would have.
  /// `notify` (may be empty) gets one line once the guest resumed its session with us, or why
  /// not. Returns 0 when there is nothing to take over, else the outcome's exit status.
  static int take_over(const std::filesystem::path& state, const std::string& vm, host::Fd notify);

  /// Serves `run`'s VM with `plan` (its generation begun or taken over): `argv` is the VMM's
  /// command (empty for a replacement, which adopts run.adopted); `on_resumed` is called when a
  /// replacement's guest resumed its session.
  Monitor(const cli::RunPlan& plan, cli::RuntimeDir& rt, VmResources& run, host::Fd& started_notify,
          std::vector<std::string> argv, std::function<void()> on_resumed = {});
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  ~Monitor();

  /// Serves the VM until its session is over (serve_vm() with the VMM, the workload's stdio on
  /// ours, the control socket), then delivers the output still owed and cleans up. Returns the
  /// exit status.
  int serve();

 private:
  // monitor_run.cpp
  cli::ServeEmbedder embedder();
  int finish(int status);
  // monitor_stdio.cpp
  void setup_stdio();
  void update_pause();
  void make_pump(int fd, std::uint64_t from);
  void hold_stdin();
  void adopt_stdin(std::uint64_t guest_pos);
  void end_stdin(const std::string& why);
  void arm_winch();
  // monitor_control.cpp
  void start_control(host::Host& h, const std::string& id);
  host::Status ctl_stop();
  host::Status ctl_kill(const control::Kill& k);
  host::Status ctl_pause();
  host::Status ctl_resume();
  void ctl_exec(control::Exec x, std::vector<host::Fd> fds, ControlRespond respond);
  // monitor_vmm.cpp
  void on_listening(host::Host& h, const std::string& id);
  void start_vmm(host::Host& h, const std::string& id);
  void adopt_vmm(host::Host& h, const std::string& id);
  void watch_daemons(host::Host& h, const std::string& id);
  void watch_vmm_exit(host::Host& h, const std::string& id, bool show);
  void end_for_daemon(host::Host& h, const std::string& id, const std::string& why);
  void stop_vmm();
  // monitor_events.cpp
  void on_event(host::Host& h, const host::Event& ev);
  void tidy_sockets(const host::Event& ev);
  void say_data_event(const host::Event& ev);
  void on_ready(const host::Event& ev);
  void on_guest(const host::Event& ev);
  void on_finished();
  void say_event(const host::Event& ev);

  const cli::RunPlan& plan_;
  const cli::ServeConfig& cfg_;
  const std::string& vmid_;
  cli::RuntimeDir& rt_;
  VmResources& run_;
  host::Fd& started_notify_;
  std::vector<std::string> argv_;
  std::function<void()> on_resumed_;

  boost::asio::io_context io_;
  host::Host* host_ = nullptr;  // while serve_vm() runs
  // The VMM and the watches on its helper daemons.
  std::unique_ptr<vm::Vmm> vmm_;
  std::list<boost::asio::posix::stream_descriptor> daemon_watch_;  // one per daemon (stable addresses)
  DaemonWatch adopted_watch_{io_};                                  // a replacement's: the recorded daemons
  /// How long end_for_daemon() waits for a QEMU whose helper daemon just exited (taken from the
  /// loop only then, when the VM is being ended anyway): covers QEMU's last steps after its
  /// sockets close (its own cleanup on a power-off, exit_files()..exit_notify() on a SIGKILL),
  /// which a loaded 2-core host can stretch well past 200 ms.
  static constexpr std::chrono::milliseconds kDaemonVsQemuExit{1000};
  // Workload output to our stdout/stderr through bounded, never-blocking writers: while either is
  // over 1 MiB behind, the data channel is not read (the guest then holds the workload back).
  cli::FdWriter out_, err_;
  bool output_paused_ = false;
  /// `neshost exec`: processes beside the workload, their streams on the fds their clients passed.
  cli::ExecAttachments execs_;
  std::unique_ptr<cli::StdinPump> pump_;
  host::Fd stdin_hold_;   // --stdin-hold: our writer on the stdin FIFO, until `close-stdin`
  host::Fd adopted_in_;   // a replacement's: the workload's stdin source reopened
  bool stdin_adopted_ = false;
  boost::asio::signal_set winch_;       // -t: SIGWINCH resizes the workload's terminal
  std::unique_ptr<cli::RawMode> raw_;   // -it on a terminal: raw until the last writes
  std::unique_ptr<ControlServer> control_;
  /// pause/unpause: QMP on the runtime dir's socket; a replacement finds the VM as the dead
  /// monitor's marker says (QEMU stays paused across it).
  VmPause pause_;
  bool guest_ready_ = false;  // pause only a guest that runs (its ready, or a replacement's resumed session)
  bool stopping_ = false;     // nor one that is stopping
  bool remove_scratch_ = false;  // --on-exit remove: the session's remove hook ran
  std::optional<host::Record> final_record_;  // the record as the session finished
  sigset_t stop_signals_;                     // SIGINT, SIGTERM: blocked from `finished` on
};

}  // namespace nes::monitor
