// One task of the shim as containerd's runc shim has a runc.Container (runc/container.go): the
// shim's own task (its process `neshost run`, the VM's monitor) or one of a pod's containers (its
// process one the VM's monitor starts with `exec.container`, host/shim/exec_proc.hpp), each with
// its record, its spec, its process and its execs, and the calls on it: Create, Start, Kill,
// State, Delete, CloseIO, ResizePty (Pause and Resume: the shim's own task). What they share
// (the loop, the shim's config, the events, the VM's control socket, the exec journal, the
// receipts of deleted processes) is the Shim. All on the io_context's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "containerd_pb.h"
#include "host/monitor/reconcile.hpp"
#include "host/shim/exec_proc.hpp"
#include "host/shim/task_service.hpp"

namespace nes::shim {

/// What Delete answered for each deleted exec and pod container, so a retry gets the same (at
/// most kMax, the oldest forgotten first), in the order they were kept.
struct Receipts {
  static constexpr std::size_t kMax = 1024;
  std::map<ProcKey, containerd::task::v2::DeleteResponse> by_key;
  std::vector<ProcKey> order;
  void keep(const ProcKey& k, const containerd::task::v2::DeleteResponse& r);
  /// A reused id is a new process: its old receipt goes (from the order too).
  void forget(const ProcKey& k);
};

/// Delete's answer for `pid` that ended with `status` at `at_ns` (a receipt read back).
containerd::task::v2::DeleteResponse receipt_response(std::uint32_t pid, std::uint32_t status, std::int64_t at_ns);
/// A Timestamp as CLOCK_REALTIME ns (set_time's inverse).
std::int64_t ns_of(const google::protobuf::Timestamp& t);

class Container {
 public:
  /// The shim's own task (`own`) or the pod's container `id`.
  Container(Shim& shim, std::string id, bool own);
  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;

  Shim& shim;
  const std::string id;
  const bool own;
  std::filesystem::path bundle;
  TaskRecord rec;
  TaskSpec spec;
  /// The shim's own task's process (`neshost run`); a pod's container's is `init`.
  Process task;
  std::unique_ptr<ExecProc> init;
  /// A pod's container: its root and hostname as the guest names them.
  std::string guest_root;
  std::optional<std::string> hostname;
  /// Its execs, by exec id.
  std::map<std::string, std::unique_ptr<ExecProc>> execs;

  /// Its own process.
  Process& process() { return own ? task : *init; }
  const Process& process() const { return own ? task : *init; }

  // In each call `x` names one of its execs; null: its own process.
  /// Create of the shim's own task: checks the bundle (config.json, one rootfs mount), records
  /// the task (intent before effect), mounts, makes a pod's share. Errors name the field.
  ttrpc::Reply create(const containerd::task::v2::CreateTaskRequest& req) { return create_task(req); }
  /// Create of a pod's container `req.id()` in `shim` (the pod's sandbox): checked against its
  /// bundle's config.json (its annotations must name this shim's sandbox), its record in its
  /// bundle before its rootfs is mounted under the pod's share (`<share>/<vm id of the
  /// container>/rootfs`, the guest's /run/nes/pod/.../rootfs), journaled before the answer.
  /// Errors name the container and the field; the pod and its other containers are untouched.
  static ttrpc::Reply create_in_pod(Shim& shim, const containerd::task::v2::CreateTaskRequest& req);
  /// Start: `neshost run` spawned (the shim's own task), or the monitor asked (a pod's
  /// container, an exec: ExecProc::start); `respond` answered then.
  void start(ExecProc* x, ttrpc::Respond respond);
  /// Kill (`all`: its execs too, before its own process). The shim's own task: SIGKILL ends its
  /// session if the VM is not gone 10 s after the guest was told; SIGTERM to a booting VM ends it
  /// in order; another signal to a booting guest answers kKillNotReadyYet (kill_later()).
  ttrpc::Reply kill(ExecProc* x, std::uint32_t signal, bool all);
  /// kill()'s answer for a signal the guest cannot take yet (it boots).
  static constexpr const char* kKillNotReadyYet = "kill: the guest is not ready yet";
  /// The signal of a kill() answered kKillNotReadyYet, delivered once the guest runs (at most
  /// 30 s, deliver.hpp), answered then.
  void kill_later(std::uint32_t signal, ttrpc::Respond respond);
  /// State (its own process: PAUSED while the VM is paused).
  containerd::task::v2::StateResponse state(ExecProc* x) const;
  /// Delete of a process not running, its receipt durable first (the task's in its bundle, an
  /// exec's in the journal, a pod container's in its bundle: then it is gone from the shim).
  ttrpc::Reply del(ExecProc* x);
  /// CloseIO (stdin): recorded before it is done; the task's monitor told (deliver.hpp).
  ttrpc::Reply close_stdin(ExecProc* x);
  /// ResizePty (the shim's own task: the latest size delivered once the monitor listens).
  ttrpc::Reply resize(ExecProc* x, std::uint32_t height, std::uint32_t width);
  /// Exec: a new exec (`req`: checked; journaled before the answer; /tasks/exec-added).
  ttrpc::Reply add_exec(const containerd::task::v2::ExecProcessRequest& req);

  // ---- the shim's own task: its VM's monitor (container_vm.cpp) ----
  /// A shim started again on its bundle (TaskService::restore).
  std::optional<std::string> restore();
  /// The VM's monitor runs: `neshost run` (our child), or the replacement that adopted the VM.
  bool monitor_alive() const;
  /// Whether the VM is paused (its monitor's marker of the current generation).
  bool vm_paused() const;
  /// Pause / Resume (`resume`) of the VM through its monitor, waiting for a booting guest.
  void pause_resume(bool resume, ttrpc::Respond respond);
  /// The task ended with `status` at `at_ns`: its exit published, its waiters answered.
  void finish(std::uint32_t status, std::int64_t at_ns);

 private:
  ttrpc::Reply create_task(const containerd::task::v2::CreateTaskRequest& req);
  ttrpc::Reply create_task_mounts(const containerd::task::v2::CreateTaskRequest& req, TaskSpec& s, bool pod);
  host::Status mount_in_pod(const containerd::task::v2::CreateTaskRequest& req, const TaskSpec& sp,
                            const std::string& dir);
  host::Result<containerd::task::v2::DeleteResponse> delete_in_pod();
  ttrpc::Reply kill_task(std::uint32_t signal);
  ttrpc::Reply spawn();
  host::Status persist(std::string_view point);
  void kill_session();
  void stdio_from_record();
  void watch_exit(int fd);
  void on_exit();
  bool readopt();
  void deliver_close_stdin();
  void deliver_resize(std::uint32_t height, std::uint32_t width);
  void publish_paused(bool resume);
  std::size_t replay_recorded_controls();

  // The shim's own task's monitor.
  host::Fd pidfd_;
  /// The replacement monitor serving the VM after `neshost run` died (readopt()); not our child.
  std::optional<host::ProcessIdentity> adopted_;
  bool restored_ = false;  // restore(): rec.pid is not our child (signalled by identity only)
  std::optional<boost::asio::posix::stream_descriptor> exit_watch_;
  boost::asio::steady_timer kill_timer_;  // SIGKILL's deadline for the guest
  unsigned resize_gen_ = 0;               // the latest ResizePty's delivery (deliver.hpp)
  std::optional<std::pair<std::uint32_t, std::uint32_t>> last_size_;  // its (rows, cols)
  bool close_stdin_told_ = false;         // close-stdin is (being) delivered to the monitor
};

/// What a shim's containers share.
class Shim {
 public:
  Shim(boost::asio::io_context& io, ServiceConfig cfg, Publisher& events);
  ~Shim();
  boost::asio::io_context& io;
  ServiceConfig cfg;
  Publisher& events;
  /// The task is a pod's sandbox (its config.json says so): it serves the pod's containers.
  bool pod = false;
  /// Every container by id: the shim's own task (always) and the pod's containers not deleted.
  std::map<std::string, std::unique_ptr<Container>> containers;
  Receipts receipts;
  // Threads asking the guest for its processes (each bounded by the control socket's timeout);
  // joined before the service goes.
  std::list<std::thread> askers;

  /// The shim's own task.
  Container& own() { return *own_; }
  const Container& own() const { return *own_; }
  /// The VM's control socket (the shim's own task's VM).
  std::filesystem::path control() const;
  /// The exec or pod container's process `k`, or null.
  ExecProc* find(const ProcKey& k);
  /// The pod's container `id` (not the shim's own), or null.
  Container* pod_container(const std::string& id);
  /// The exec journal written from what the shim knows now (exec_journal.hpp save_exec_journal;
  /// `point`: its fault point). Errors name the file and the errno.
  host::Status persist_execs(std::string_view point);
  /// persist_execs(), its failure a warning in the shim's log (what a replacement would not know).
  void note_execs(std::string_view point);

 private:
  Container* own_;
};

}  // namespace nes::shim
