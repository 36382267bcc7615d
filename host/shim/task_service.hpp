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
#include "host/shim/task_record.hpp"
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
