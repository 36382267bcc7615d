// The task's files in its bundle (docs/containerd.md "A shim replaced"): its record
// (`nesinit-task.json`: what `shim delete` and a replaced shim act on) and its Delete's receipt
// (`nesinit-deleted.json`: what a retried Delete, a later shim or `shim delete` answers). Both
// are written durably (host/shim/durable.hpp) before what they announce.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::shim {

/// The record's file name in a task's bundle (a pod's container's in its own bundle).
inline constexpr const char* kTaskFile = "nesinit-task.json";
/// What Delete answered (pid, exit status, exited_at), kept in the bundle so a retried Delete,
/// a later shim or `shim delete` answers the same (containerd removes the bundle after).
inline constexpr const char* kReceiptFile = "nesinit-deleted.json";

/// A journaled control (docs/containerd.md "Controls journaled"): its sequence number and its
/// control request line (host/monitor/control.hpp, e.g. `kill 10 3`, `pause`), recorded before
/// it is sent and removed once the monitor answered.
struct PendingControl {
  std::uint64_t seq = 0;
  std::string request;
  bool operator==(const PendingControl&) const = default;
};
/// How many controls may be recorded unanswered at once (a further one is refused).
inline constexpr std::size_t kPendingControlsMax = 64;

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
  /// The last control sequence number used for this task's VM (its monitor's; a pod's containers
  /// and execs share it), and the controls recorded and not yet answered, oldest first: a
  /// replaced shim sends each again with its number (the monitor applies each once). Optional
  /// (absent: 0, none); the shim's own task's record only.
  std::uint64_t control_seq = 0;
  std::vector<PendingControl> controls;
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

/// The receipt in `bundle` (nullopt: none, or one that does not parse).
std::optional<Cleanup> load_receipt(const std::filesystem::path& bundle);

}  // namespace nes::shim
