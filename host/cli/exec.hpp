// `neshost exec VM -- ARGV`: another process in a running VM's guest, as `docker exec` (and the
// containerd shim's Exec) expect. The client passes its own fds 0-2 to the VM's monitor (the
// `neshost run` process, which owns the guest's channels) over the control socket (SCM_RIGHTS)
// with the request; the monitor starts the process through Host::exec and moves its streams
// between the guest and those fds itself, never blocking. The client waits for the end and exits
// with its status (docker exec's: the code, 128+N for a signal, 126/127 when it cannot start,
// 125 when the host side fails). Why: docs/host.md "Exec".
#pragma once

#include <utility>  // before Asio 1.74

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/lib/host.hpp"
#include "host/monitor/monitor.hpp"

namespace nes::cli {

/// The process a control request `exec FLAGS JSON` (host/monitor/control.hpp control::Exec) asks
/// for, its FLAGS applied: "e" the workload's env with the request's on top, "c" the workload's
/// cwd unless the request sets one, "u" the workload's uid/gid/groups. `workload` is the running
/// workload's exec. The result's `proc` is the client's; the monitor numbers the process itself.
proto::ExecProcess resolve_exec(control::Exec request, const proto::Exec& workload);

/// The monitor's side of `neshost exec`: one entry per process the control socket started.
/// Output goes to the fds the client passed through FdWriters of 1 MiB each: while one is full
/// the data channel is paused (the guest then holds the process back, lossless), as for the
/// workload's own output. stdin comes from the passed fd 0 through a StdinPump. The final reply
/// (control::Exited, "ok exit STATUS[ REASON]") goes once the output is written (or its reader
/// gone), so a client that exits on it has all of it; output the host could not deliver to it (a
/// stream that ended without its eof, ExecHooks::lost) makes it "ok exit 125 N bytes of stdout
/// lost: ...".
class ExecAttachments {
 public:
  /// `pause_changed`: any_full() may have changed (the caller re-decides Host::pause_output).
  ExecAttachments(boost::asio::io_context& io, std::string vm, std::function<void()> pause_changed);
  ~ExecAttachments();
  void set_host(host::Host* h) { host_ = h; }
  /// Serves one `exec` request with the client's fds 0-2 (ControlHandlers::exec). Before the
  /// workload has started (the VM still booting) it waits, answering control::Waiting first (at
  /// most kExecMax waiting; they fail when the workload ends before it starts).
  void start(control::Exec request, std::vector<host::Fd> fds, ControlRespond respond);
  /// Serves `wait PROC` (ControlHandlers::wait): for a live process control::Started (Waiting
  /// until it has started), then control::Exited once it ended and its output is written, as its
  /// own `exec` connection gets them; for one of the last control::kWaitEndedKept that ended its
  /// Exited at once; control::Error for a process this monitor never started or forgot. At most
  /// control::kWaitersMax waits per process: a newer one ends the oldest with control::Error.
  void wait(std::uint16_t proc, ControlRespond respond);
  /// The workload started (Milestone::started): waiting requests go ahead.
  void workload_started();
  /// The workload's outcome is in: waiting requests fail.
  void workload_ended();
  /// An output queue of a live process is full.
  bool any_full() const;
  /// The host's stdin queue has room again (StdioHooks::stdin_writable): pumps read on.
  void resume_stdin();
  /// Every process's output is written and its final reply sent. After the session the monitor
  /// runs its loop until then (or a signal), so a slow exec client costs time, never bytes.
  bool idle() const { return live_.empty(); }
  /// Bytes still queued for the clients' fds: what a monitor that gives up leaves undelivered.
  std::size_t queued() const;
  /// The Host is gone (the session is over): no more stdin for it; output goes on being written.
  void host_gone();

  struct Attached;

 private:
  void finish(std::uint16_t proc);

  boost::asio::io_context& io_;
  std::string vm_;
  std::function<void()> pause_changed_;
  host::Host* host_ = nullptr;
  std::map<std::uint16_t, std::shared_ptr<Attached>> live_;
  struct Queued {
    control::Exec request;
    std::vector<host::Fd> fds;
    ControlRespond respond;
  };
  std::vector<Queued> waiting_;
  std::deque<std::pair<std::uint16_t, control::Exited>> ended_procs_;  // newest last, at most kWaitEndedKept
  bool started_ = false, ended_ = false;
};

}  // namespace nes::cli
