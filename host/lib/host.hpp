// nes::host::Host — the thin Asio loop around Session (host/lib/session.hpp): endpoints, timers,
// guest streams, the durable-record worker pool, embedder hooks and the API. One io_context;
// C++20 coroutines (asio::awaitable) for accept and read loops. Why: docs/host.md.
#pragma once

#include <utility>  // before Asio 1.74: awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "host/lib/data_channel.hpp"
#include "host/lib/endpoint.hpp"
#include "host/lib/base.hpp"
#include "host/lib/record.hpp"
#include "host/lib/session.hpp"

namespace nes::host {

/// One line's worth of what happened to a VM (for logs and the CLI). `kind` is a snake_case tag
/// (connected, ready, boot_sent, started, outcome, recorded, shutdown_sent, destroy, ...). Output
/// the host did not deliver (docs/host.md "Output lost"): `output_cut` (the host closed the data
/// channel before the output's end, detail: why), `output_lost` (exact, detail e.g. "stdout 1234
/// bytes" or "proc=2 stderr 5 bytes"), `output_truncated` (a stream ended without its eof and
/// nothing counted the rest), `record_amended` (the record now carries it), `stop_deferred` (the
/// stop deadline restarts while output still moves), `exec_output_wait` (so does an exec'd
/// process's window after its exec_exited).
struct Event {
  std::string vm;
  std::uint64_t generation = 0;
  std::string kind;
  std::string detail;                       // escaped: safe to print
  act::Milestone milestone = act::Milestone::other;  // what embedders act on, typed
  std::optional<proto::Outcome> outcome;    // with Milestone::outcome/recorded: which one
};

/// Embedder callbacks, called on the io_context thread; they must not block. `destroy`: kill the
/// VMM now (the guest did not power off in time). `remove`: delete the VM's resources (called
/// only once the record is durable and the embedder reported vm_exited).
struct Hooks {
  std::function<void(const std::string& vm, std::uint64_t generation)> destroy;
  std::function<void(const std::string& vm, std::uint64_t generation)> remove;
};

/// Host-wide settings.
struct HostOptions {
  std::filesystem::path state_dir;   // records go to <state_dir>/<vm>/outcome.json
  std::size_t writer_threads = 2;    // group commits in flight at once (bounded); the worker
                                     // pool has one thread more, for log closes and lookups
  Hooks hooks;
  std::function<void(const Event&)> on_event;  // called synchronously on the io_context thread
  WriteOptions write;                // retries, lock bound, test fault injection
  std::size_t read_chunk = 8192;     // bytes per read from a guest stream
  std::size_t send_cap = 256 * 1024; // bytes queued to one guest, beyond which sends are dropped
  /// Workload stdio on the data channel (VMs whose descriptor has `stdio`): the embedder's
  /// callbacks, and the built-in log at <state_dir>/<vm>/workload.log.
  StdioHooks stdio;
  WorkloadLogOptions workload_log;
  std::size_t stdin_cap = 256 * 1024;  // bytes of stdin frames queued per VM (send_stdin refuses above)
  /// Once a VM is finished: read its data channel to EOF for at most this long, then close it.
  /// Also the short bound the guest gets to power off (and count what it could not deliver)
  /// after the host closed the data channel early at its stop deadline, and the window after an
  /// exec'd process's exec_exited for its last output (restarted while output still moves). ms.
  std::chrono::milliseconds data_drain{2000};
};

/// The durable record, or why there is none.
using WaitResult = Result<Record>;

// ExecLost and ExecEnd (how a process Host::exec() started ended): host/lib/session.hpp.
/// ExecEnd as an exit status, docker exec's convention: the code; 128+N for signal N (POSIX
/// shells); exec_failed not_found 127, else 126; lost 125 (the host's side failed).
int exec_exit_status(const ExecEnd& e);

/// Where a process Host::exec() starts runs: the guest's own root and namespaces (both unset), a
/// new container (`container`), or inside a running one (`in`: its process number). At most one.
struct ExecWhere {
  std::optional<proto::Container> container;
  std::optional<std::uint16_t> in;
};

/// Callbacks for one process Host::exec() started, on the io_context thread; they must not
/// block. `data`: its output (stdout or stderr, 1..65536 bytes per call, in order); `eof`: one of
/// its streams ended; `started`: it runs, with its pid in the guest (stdin may be sent from now
/// on); `ended`: once, last, after its output (or HostOptions::data_drain after its exec_exited
/// while no output moves on the data channel, when its eofs do not come). `lost`: before `ended`,
/// for each stream that ended without its eof: `bytes` lost exactly (the guest's count against
/// the bytes received), or unset when nothing has counted them yet (`received`: bytes that came).
struct ExecHooks {
  std::function<void(std::int32_t pid)> started;
  std::function<void(proto::Stream stream, std::string_view bytes)> data;
  std::function<void(proto::Stream stream)> eof;
  std::function<void(proto::Stream stream, std::optional<std::uint64_t> bytes, std::uint64_t received)> lost;
  std::function<void(const ExecEnd& end)> ended;
};

/// Serves many VMs on one io_context. Every member function must be called on the io_context's
/// thread (post to it from elsewhere). Outcome records are written on an internal thread pool;
/// nothing here blocks on a guest or a disk.
class Host {
 public:
  Host(boost::asio::io_context& io, HostOptions opt);
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  /// Register a VM generation. A registered VM with an older generation is superseded (its
  /// stream closed, its late events ignored); the same or a newer one is refused.
  Status add_vm(SessionConfig cfg);
  /// Listen for this VM's guest on its own Unix socket (see listen_unix() in endpoint.hpp).
  Status listen_unix(const std::string& vm, const UnixListenOptions& opt);
  /// Hand in an already-connected stream for this VM (socketpair, inherited fd, ...). Owns fd.
  Status attach_stream(const std::string& vm, Fd fd);
  /// Listen on AF_VSOCK VMADDR_CID_ANY:port; peers are mapped to VMs by map_cid().
  Status listen_vsock(std::uint32_t port);
  /// Peer CID -> VM for the vsock listener; unknown CIDs are refused.
  Status map_cid(std::uint32_t cid, const std::string& vm);

  /// Listen for this VM's data channel (workload stdio) on its own Unix socket, e.g. the QEMU
  /// chardev of port nes.1 or firecracker_data_path(). One connection per VM generation; a VM
  /// whose descriptor has no `stdio` refuses it.
  Status listen_data_unix(const std::string& vm, const UnixListenOptions& opt);
  /// Hand in an already-connected data channel for this VM. Owns fd.
  Status attach_data_stream(const std::string& vm, Fd fd);
  /// Listen on AF_VSOCK VMADDR_CID_ANY:port for data channels (kDataVsockPort); peers are
  /// mapped to VMs by map_cid() as for the lifecycle channel.
  Status listen_vsock_data(std::uint32_t port);
  /// Workload stdin (descriptor stdio.stdin true): queue bytes / the eof. Never blocks; refused
  /// when stdin_cap bytes are queued (StdioHooks::stdin_writable says when to retry), when no
  /// data channel is up, or after the eof.
  /// `proc` != 0: the stdin of that process exec() started (after its `started` hook).
  Status send_stdin(const std::string& vm, std::string_view bytes, std::uint16_t proc = 0);
  Status send_stdin_eof(const std::string& vm, std::uint16_t proc = 0);
  /// The workload's terminal size changed (descriptor stdio.terminal set); rows, cols >= 1.
  /// Before `boot` it is the size the workload starts with; before the data channel is up it is
  /// sent once it is (the latest wins). `proc` != 0: that exec'd process's terminal (running).
  Status send_resize(const std::string& vm, std::uint16_t rows, std::uint16_t cols, std::uint16_t proc = 0);

  /// Start another process in the VM's guest beside the workload (`exec`, docs/protocol.md
  /// "Exec": `ctr task exec`, `neshost exec`). `stdio`: its own streams on the data channel
  /// (unset: /dev/null in the guest). Returns its process number (1..65535, this VM's next);
  /// every later report goes to `hooks`, `ended` always once. Errors: no such VM, no booted
  /// session, the workload ended, `stdio` without a data channel, 16 running already, a field
  /// the guest would refuse. An init that predates `exec` never answers: kExecAnswerWait bounds
  /// the wait for exec_started (then `ended` with `lost`).
  /// `where` (feature "container", docs/protocol.md "Containers"): `container` set: the process
  /// is a new container's PID 1 in the guest: pivot_root'ed into `container.root` (a guest
  /// directory, e.g. a container's rootfs under the pod's share), its own mount and pid (and,
  /// with a hostname, UTS) namespaces, /proc, /dev, /sys, /etc/hosts, /etc/resolv.conf as runc
  /// gives them, the VM's network; `in` set: the process joins the container started by this
  /// VM's exec() as process `in` (its root and namespaces: `runc exec`). Errors besides the
  /// above: both set, a malformed field (named: `exec.container.root: ...`), an init that does
  /// not announce "container". A root missing or not a directory, a program missing in it, or
  /// an `in` naming no running container come back as `ended` with exec_failed (127: not found).
  Result<std::uint16_t> exec(const std::string& vm, proto::Exec exec, std::optional<proto::Stdio> stdio,
                             ExecHooks hooks, ExecWhere where = {});
  static constexpr std::chrono::milliseconds kExecAnswerWait{10000};
  /// `kill{signal, proc}`: signal 1..64 to the group of the process exec() started as `proc`.
  Status kill_exec(const std::string& vm, std::uint16_t proc, int signal);
  /// Flow control for StdioHooks::data: while paused the data channel is not read (the guest
  /// holds the workload, or drops in lossy mode). The lifecycle channel is never affected.
  Status pause_output(const std::string& vm, bool paused);

  /// The VMM process started: the `ready` deadline runs from now.
  Status vm_started(const std::string& vm);
  /// The VMM process exited.
  Status vm_exited(const std::string& vm);

  /// `stop` to the guest (SIGTERM to the workload), now or right after boot.
  Status stop(const std::string& vm);
  /// `kill{signal}` to the guest; signal 1..64; needs a booted session. After the outcome, while
  /// output is owed (output_owed()), it also ends the wait for that output as shutdown() does.
  Status kill(const std::string& vm, int signal);
  /// `shutdown` to the guest; then wait for vm_exited (destroy hook past the stop deadline).
  /// After the outcome, while output is owed, the host ends the wait for it on purpose: the data
  /// channel is closed before its eofs, the guest counts what it could not deliver
  /// (`output_lost`: an `output_lost` event, a gap in workload.log, `lost` in the record) and
  /// powers off. Before the outcome the workload is stopped (`stop`, grace) and its output is
  /// read until the stop deadline; what is still owed then is cut the same way (the wall limit
  /// does likewise).
  Status shutdown(const std::string& vm);
  /// The outcome is in and the data channel is still open: the guest holds output (and its
  /// power-off) for the host, which reads it as fast as its consumer takes it; shutdown() now
  /// cuts it. false for an unknown VM.
  bool output_owed(const std::string& vm) const;

  /// The guest's processes (`list_processes`, `ctr task ps`, `neshost top`), at most
  /// kListProcessesWait from now; the handler runs on the io_context, once. Answers carry no
  /// request id: a list that arrives answers the oldest request waiting. Errors: no such VM, no
  /// guest connected, more than kListProcessesInFlight waiting, no answer in time (an init that
  /// predates the message skips it), the stream lost first.
  void async_list_processes(const std::string& vm, std::function<void(Result<proto::Processes>)> handler);
  static constexpr std::chrono::milliseconds kListProcessesWait{2000};
  static constexpr std::size_t kListProcessesInFlight = 16;

  /// A running container's cgroup in the guest (`container_resources`: `r.update` written first,
  /// then its use read), at most kListProcessesWait from now; the handler runs on the
  /// io_context, once, with the guest's answer (its `error` set when the guest refused) or an
  /// Error as async_list_processes' (answers arrive in the order asked).
  void async_container_resources(const std::string& vm, const proto::ContainerResourcesRequest& r,
                                 std::function<void(Result<proto::ContainerResourcesReply>)> handler);

  /// The VM's durable outcome: immediately if recorded for the VM's current generation (on disk
  /// too, e.g. written by an earlier process), else when it becomes durable. For an unregistered
  /// VM: whatever the state dir holds, or an error. The handler runs on the io_context.
  void async_wait(const std::string& vm, std::function<void(WaitResult)> handler);
  /// Coroutine form of async_wait.
  boost::asio::awaitable<WaitResult> wait(std::string vm);

  /// Forget a VM whose session has finished: its registration, its CID mappings and its memory
  /// (a long-lived embedder would otherwise keep every VM it ever ran). Its record stays on disk,
  /// so async_wait() still answers from there. Errors: not registered, or the session is still
  /// live (shutdown() it and wait for the outcome first).
  Status forget_vm(const std::string& vm);

  /// Registered VMs whose session has not finished.
  std::size_t live_sessions() const;
  /// The VM's session state machine (inspection only), or nullptr.
  const Session* session(const std::string& vm) const;
  /// Bytes of the guest's unfinished line held for this VM now (its stream's reader: at most
  /// line_cap + 1 whatever the guest sends); 0 with no stream or no such VM.
  std::size_t buffered_bytes(const std::string& vm) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace nes::host
