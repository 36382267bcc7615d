// containerd.task.v2.Task (containerd's runtime-v2 shim API, runtime/v2/task/shim.proto) for one
// task = one microVM. The VM is run by a `neshost run` child (as containerd's runc shim runs
// `runc`): Create checks the bundle (config.json, rootfs mounts) and persists the task; Start
// spawns `neshost run --rootfs ROOT ... -- ARGS` with containerd's stdio FIFOs as its fds 0-2, in
// its own session; Kill and ResizePty go to that VM's control socket; Wait/State/Delete answer
// from its durable outcome record (exit status 128+N for a signal N, exited_at = finished_at).
// The task's state file `<bundle>/nesinit-task.json` is written durably (host/monitor/reconcile.hpp
// write_durable) so `shim delete` after a SIGKILLed shim finds the VM and ends it.
// A pod (host/shim/pod.hpp, docs/containerd.md "Pods"): the sandbox's shim serves every task of
// the pod. The sandbox task is the VM (the pause process its workload, in the pause image as the
// VM's root); each container task is a process the VM's monitor starts with `exec.container`
// (its own root, mount and pid namespaces) on the rootfs the shim mounted under the pod's share.
// Calls and what they answer: docs/containerd.md.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "host/lib/base.hpp"
#include "host/shim/events.hpp"
#include "host/shim/ttrpc.hpp"

namespace nes::shim {

/// Where the task runs and who to tell.
struct ServiceConfig {
  std::string ns;                  // containerd namespace
  std::string id;                  // task (container) id
  std::filesystem::path bundle;    // the bundle directory (config.json, rootfs/)
  std::filesystem::path neshost;   // the `neshost` program (a bare name is looked up on PATH)
  std::function<void()> shutdown;  // Shutdown accepted: stop serving and exit
};

/// The persisted part of the task (`<bundle>/nesinit-task.json`, schema_version 1).
struct TaskRecord {
  std::string id, vm;
  std::filesystem::path state_dir;     // neshost's --state for this task
  pid_t pid = 0;                       // the `neshost run` process (its session leader), 0 before Start
  unsigned long long pid_start = 0;    // its start time (/proc/PID/stat field 22): a recycled pid differs
  bool mounted_rootfs = false;         // Create mounted req.rootfs on <bundle>/rootfs
  /// A pod's sandbox: the pod's share (`<bundle>/nesinit-pod`, a read-only shared view of the
  /// shim's own `<bundle>/nesinit-pod.d`, the guest's /run/nes/pod). A pod's container: where its rootfs is mounted under that share.
  /// Empty: neither. Optional on the wire (absent: empty).
  std::filesystem::path pod_share;
  /// A pod's container (its process runs in the sandbox's VM, `vm` and `state_dir` are the
  /// sandbox's): `shim delete` unmounts its rootfs and never touches the VM. Optional (false).
  bool container = false;
  /// containerd's stdio for the task (FIFO paths, `file://PATH` or empty) and whether it has a
  /// terminal: what a replaced shim answers in State, so `ctr task attach` and a restarted
  /// containerd find the FIFOs again. Optional (absent: empty, false).
  std::string stdin_path, stdout_path, stderr_path;
  bool terminal = false;
  /// Create finished (every mount made, the task CREATED): a replaced shim restores a task that
  /// was created and not started. Optional (absent: false).
  bool created = false;
  /// CloseIO closed the task's stdin: a replaced shim tells the monitor again (`close-stdin`,
  /// idempotent) and holds no writer of its own. Optional (absent: false).
  bool stdin_closed = false;
  bool operator==(const TaskRecord&) const = default;
};
/// One JSON object plus '\n'.
std::string encode_task_record(const TaskRecord& r);
/// Parse; the error names the field.
host::Result<TaskRecord> parse_task_record(std::string_view json);
/// Read `<bundle>/nesinit-task.json`; nullopt if there is none.
host::Result<std::optional<TaskRecord>> load_task_record(const std::filesystem::path& bundle);

/// What `shim delete` reports for a task whose shim is gone.
struct Cleanup {
  pid_t pid = 0;
  std::uint32_t exit_status = 0;
  std::int64_t exited_at_ns = 0;  // Unix time, ns
  bool operator==(const Cleanup&) const = default;
};
/// A deleted task's receipt (`<bundle>/nesinit-deleted.json`, schema_version 1): what its Delete
/// answered. One JSON object plus '\n'; parse errors name the field.
std::string encode_receipt(const Cleanup& c);
host::Result<Cleanup> parse_receipt(std::string_view json);

/// `shim delete`: end the task's VM if it still runs (SIGKILL to the `neshost run` session:
/// QEMU and virtiofsd die with it), unmount what Create mounted (a sandbox's pod share with
/// everything under it), remove the task's state. The exit status is the recorded one if the VM
/// recorded an outcome, else 137 (128+SIGKILL). A pod's container (TaskRecord::container): only
/// its rootfs is unmounted from the pod's share; the pod's VM is its sandbox's to end (137).
/// After the task's Delete: that Delete's answer (its receipt), identical.
Cleanup cleanup_task(const std::filesystem::path& bundle);

/// The Task service, registered on a ttrpc Server. All calls on the io_context's thread.
class TaskService {
 public:
  TaskService(boost::asio::io_context& io, ServiceConfig cfg, Publisher& events);
  ~TaskService();
  TaskService(const TaskService&) = delete;
  TaskService& operator=(const TaskService&) = delete;

  /// Register every Task method on `server` (containerd.task.v2.Task).
  void register_on(ttrpc::Server& server);

  /// A shim started again on its bundle (the one before was SIGKILLed): the task its
  /// `nesinit-task.json` records, RUNNING with the same pid, if its `neshost run` still runs
  /// (same pid and start time), and its execs as the exec journal names them
  /// (host/shim/exec_journal.hpp; a pod's sandbox: the pod's containers and their execs too); a
  /// task created and not started, CREATED again; a deleted one, its Delete's receipt. Returns
  /// what was re-adopted, for the log, or nullopt (nothing recorded, nothing alive: containerd's
  /// cleanup ends it).
  std::optional<std::string> restore();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace nes::shim
