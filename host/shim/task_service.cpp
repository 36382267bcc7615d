// containerd.task.v2.Task for one microVM task (host/shim/task_service.hpp).
#include "host/shim/task_service.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <thread>
#include <vector>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include "containerd_pb.h"
#include "host/lib/base.hpp"
#include "host/monitor/adopt.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/vmm_record.hpp"
#include "host/monitor/reconcile.hpp"
#include "protocol/codec.hpp"
#include "host/lib/record.hpp"
#include "host/shim/deliver.hpp"
#include "host/shim/durable.hpp"
#include "host/shim/exec_journal.hpp"
#include "host/shim/fault_point.hpp"
#include "host/shim/gated_spawn.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/log.hpp"
#include "host/shim/mount_points.hpp"
#include "host/shim/oci_spec.hpp"
#include "host/shim/pod.hpp"
#include "host/shim/process.hpp"
#include "base/small_file.hpp"

extern char** environ;

namespace nes::shim {
namespace asio = boost::asio;
namespace fs = std::filesystem;
namespace v2 = containerd::task::v2;
namespace ev = containerd::events;
using host::Error;
using host::Fd;
using host::Result;
using namespace std::chrono_literals;

constexpr std::string_view kService = "containerd.task.v2.Task";
constexpr const char* kTaskFile = "nesinit-task.json";
/// What Delete answered (pid, exit status, exited_at), kept in the bundle so a retried Delete,
/// a later shim or `shim delete` answers the same (containerd removes the bundle after).
constexpr const char* kReceiptFile = "nesinit-deleted.json";
/// A pod's share in the sandbox's bundle, and where the guest mounts it.
constexpr const char* kPodShareDir = "nesinit-pod";
constexpr std::string_view kPodShareGuest = "/run/nes/pod";

// ---- the persisted task ----

std::string encode_task_record(const TaskRecord& r) {
  std::string pod;
  if (!r.pod_share.empty()) pod += fmt::format(R"(,"pod_share":{})", host::json_string(r.pod_share.string()));
  if (r.container) pod += R"(,"container":true)";
  if (!r.stdin_path.empty()) pod += fmt::format(R"(,"stdin":{})", host::json_string(r.stdin_path));
  if (!r.stdout_path.empty()) pod += fmt::format(R"(,"stdout":{})", host::json_string(r.stdout_path));
  if (!r.stderr_path.empty()) pod += fmt::format(R"(,"stderr":{})", host::json_string(r.stderr_path));
  if (r.terminal) pod += R"(,"terminal":true)";
  if (r.created) pod += R"(,"created":true)";
  if (r.stdin_closed) pod += R"(,"stdin_closed":true)";
  return fmt::format(R"({{"schema_version":1,"id":{},"vm":{},"state_dir":{},"pid":{},"pid_start":{},"mounted_rootfs":{}{}}})"
                     "\n",
                     host::json_string(r.id), host::json_string(r.vm), host::json_string(r.state_dir.string()), r.pid,
                     r.pid_start, r.mounted_rootfs, pod);
}

Result<TaskRecord> parse_task_record(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return Error{"nesinit-task.json: expected a JSON object"};
  TaskRecord r;
  std::string_view s;
  std::uint64_t u = 0;
  if (o["schema_version"].get_uint64().get(u) || u != 1) return Error{"nesinit-task.json: schema_version: expected 1"};
  if (o["id"].get_string().get(s)) return Error{"nesinit-task.json: id: expected a string"};
  r.id = std::string(s);
  if (o["vm"].get_string().get(s) || !host::check_vm_id(s)) return Error{"nesinit-task.json: vm: expected a VM id"};
  r.vm = std::string(s);
  if (o["state_dir"].get_string().get(s) || s.empty() || s.front() != '/')
    return Error{"nesinit-task.json: state_dir: expected an absolute path"};
  r.state_dir = std::string(s);
  if (o["pid"].get_uint64().get(u) || u > 0x7fffffff) return Error{"nesinit-task.json: pid: expected a pid"};
  r.pid = static_cast<pid_t>(u);
  if (o["pid_start"].get_uint64().get(u)) return Error{"nesinit-task.json: pid_start: expected an integer"};
  r.pid_start = u;
  if (o["mounted_rootfs"].get_bool().get(r.mounted_rootfs)) return Error{"nesinit-task.json: mounted_rootfs: expected a boolean"};
  if (auto e = o["pod_share"]; e.error() != simdjson::NO_SUCH_FIELD) {
    if (e.get_string().get(s) || s.empty() || s.front() != '/')
      return Error{"nesinit-task.json: pod_share: expected an absolute path"};
    r.pod_share = std::string(s);
  }
  if (auto e = o["container"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.container))
    return Error{"nesinit-task.json: container: expected a boolean"};
  if (r.container && r.pod_share.empty()) return Error{"nesinit-task.json: pod_share: required for a container"};
  for (auto [name, field] : {std::pair{"stdin", &r.stdin_path}, {"stdout", &r.stdout_path}, {"stderr", &r.stderr_path}}) {
    if (auto e = o[name]; e.error() != simdjson::NO_SUCH_FIELD) {
      if (e.get_string().get(s)) return Error{fmt::format("nesinit-task.json: {}: expected a string", name)};
      *field = std::string(s);
    }
  }
  if (auto e = o["terminal"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.terminal))
    return Error{"nesinit-task.json: terminal: expected a boolean"};
  if (auto e = o["created"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.created))
    return Error{"nesinit-task.json: created: expected a boolean"};
  if (auto e = o["stdin_closed"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.stdin_closed))
    return Error{"nesinit-task.json: stdin_closed: expected a boolean"};
  return r;
}

Result<std::optional<TaskRecord>> load_task_record(const fs::path& bundle) {
  auto text = base::read_small_file((bundle / kTaskFile).c_str(), 64 * 1024);
  if (!text) {
    if (text.error().err == ENOENT) return std::optional<TaskRecord>{};
    return text.error();
  }
  auto r = parse_task_record(*text);
  if (!r) return r.error();
  return std::optional<TaskRecord>(std::move(*r));
}

namespace {

std::optional<unsigned long long> start_time(pid_t pid) {
  auto id = host::identity_of(pid);
  if (!id) return std::nullopt;
  return id->start_time;
}

bool same_process_alive(pid_t pid, unsigned long long start) {
  if (pid <= 0) return false;
  auto st = start_time(pid);
  return st && *st == start;
}

// mount(2) of one containerd rootfs mount (types.Mount: type, source, options as fstab options).
host::Status mount_rootfs(const containerd::types::Mount& m, const fs::path& target) {
  unsigned long flags = 0;
  std::string data;
  for (const auto& o : m.options()) {
    if (o == "ro") flags |= MS_RDONLY;
    else if (o == "rw") {}
    else if (o == "bind") flags |= MS_BIND;
    else if (o == "rbind") flags |= MS_BIND | MS_REC;
    else if (o == "nosuid") flags |= MS_NOSUID;
    else if (o == "nodev") flags |= MS_NODEV;
    else if (o == "noexec") flags |= MS_NOEXEC;
    else if (o == "noatime") flags |= MS_NOATIME;
    else if (o == "relatime") flags |= MS_RELATIME;
    else if (o == "strictatime") flags |= MS_STRICTATIME;
    else if (o == "private" || o == "rprivate" || o == "slave" || o == "rslave" || o == "shared" ||
             o == "rshared") {}  // propagation: the shim's mount namespace decides, nothing to pass
    else data += (data.empty() ? "" : ",") + o;
  }
  std::string type = m.type() == "bind" ? std::string() : m.type();
  if (::mount(m.source().c_str(), target.c_str(), type.empty() ? nullptr : type.c_str(), flags,
              data.empty() ? nullptr : data.c_str()) != 0)
    return Error{fmt::format("rootfs: mount {} ({}) on {}: {}", m.source(), m.type(), target.string(), std::strerror(errno))};
  // A bind mount ignores MS_RDONLY (and the other per-mount flags) until it is remounted.
  if ((flags & MS_BIND) && (flags & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)) &&
      ::mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_BIND | (flags & ~MS_REC), nullptr) != 0) {
    int e = errno;
    ::umount2(target.c_str(), MNT_DETACH);
    return Error{fmt::format("rootfs: remount {} read-only: {}", target.string(), std::strerror(e))};
  }
  return host::Ok{};
}

// What Create mounted on <bundle>/rootfs, if anything, unmounted.
void unmount_rootfs(const fs::path& bundle, const TaskRecord& r) {
  if (r.mounted_rootfs) ::umount2((bundle / "rootfs").c_str(), MNT_DETACH);
}

// The VM's VMM (QEMU and its daemons), which outlives `neshost run` (--vmm-outlives): SIGKILLed by
// its recorded identity (vmm.json) when the task must end whatever its monitor does; its runtime
// dir removed.
void kill_vmm(const TaskRecord& r) {
  auto v = host::load_vmm(r.state_dir, r.vm);
  if (!v || !*v) return;
  std::vector<host::ProcessIdentity> ids;
  if ((*v)->vmm) ids.push_back(*(*v)->vmm);
  for (const auto& d : (*v)->daemons) ids.push_back(d.id);
  for (const auto& id : ids) {
    Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, id.pid, 0))};
    if (pidfd && host::is_alive(id)) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
  // The VM's private runtime dir ($TMPDIR/neshost-XXXXXX: its sockets, a generated initramfs):
  // its monitor, killed, cannot remove it. Only a path of that shape is removed.
  const fs::path& rt = (*v)->runtime_dir;
  std::error_code ec;
  if (rt.is_absolute() && rt.filename().string().starts_with("neshost-")) fs::remove_all(rt, ec);
}

// Removes the directories of `dir` that are empty once their subdirectories are (the mount
// points a pod's share held), deepest first. Never unlinks a file: whatever is still mounted or
// holds data stays.
void remove_empty_dirs(const fs::path& dir) {
  struct statx sx {};
  // Still a mount (the unmount failed, or another one is there): nothing under it is ours.
  if (::statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) != 0 ||
      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT & sx.stx_attributes))
    return;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && !it->is_symlink(ec)) remove_empty_dirs(it->path());
  ::rmdir(dir.c_str());
}

// The pod's share is a read-only view (`<bundle>/nesinit-pod`, what the guest gets) of a
// directory only the shim writes (`<bundle>/nesinit-pod.d`): no guest can rename or replace a
// path the shim later unmounts or removes (the containers' rootfs, mounted on the view, stay
// writable: a mount's flags are its own). `view` under the share -> the same path under the
// shim's directory.
fs::path pod_share_real(const fs::path& share, const fs::path& under = {}) {
  return under.empty() ? fs::path(share.string() + ".d") : fs::path(share.string() + ".d") / under;
}

// The pod's share (`container` false: the view and the shim's directory) or a container's
// rootfs in it (`at` its mount point in the view), unmounted with everything under it
// (MNT_DETACH: recursive, a busy one goes once released; never through a symlink) and the mount
// points removed from the shim's directory.
void unmount_pod_share(const fs::path& at, bool container) {
  if (at.empty()) return;
  ::umount2(at.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  if (container) {
    const fs::path share = at.parent_path().parent_path();
    const fs::path real = pod_share_real(share, at.lexically_relative(share));
    ::rmdir(real.c_str());
    ::rmdir(real.parent_path().c_str());
  } else {
    remove_empty_dirs(pod_share_real(at));
    ::rmdir(at.c_str());
  }
}

// A deleted task leaves nothing: its rootfs mount, the VM's state, the task file. A container's
// leaves its rootfs mount point in the pod's share (its parent, named for the container) too.
void remove_task(const fs::path& bundle, const TaskRecord& r) {
  unmount_rootfs(bundle, r);
  std::error_code ec;
  unmount_pod_share(r.pod_share, r.container);
  if (!r.container) fs::remove_all(r.state_dir, ec);
  fs::remove(bundle / kExecJournalFile, ec);
  fs::remove(bundle / kTaskFile, ec);
}

// The VM's durable outcome, when it recorded one, is the task's exit status and time: the
// status `neshost run` exits with (host::reported_status: 125 when the workload's output was lost
// on its way to containerd's FIFOs), and each loss is a warning in the shim's log naming the task.
void apply_recorded_exit(const TaskRecord& r, std::uint32_t& status, std::int64_t& at_ns) {
  if (auto o = host::read_record(r.state_dir, r.vm); o && *o) {
    status = static_cast<std::uint32_t>(host::reported_status(**o));
    at_ns = (*o)->finished_at.time_since_epoch().count();
    for (const auto& l : host::describe_loss(**o))
      log("warning: task {}: {} (exit status {} instead of {})", r.id, l,
                 status, (*o)->exit_status);
  }
}

}  // namespace

std::string encode_receipt(const Cleanup& c) {
  return fmt::format(R"({{"schema_version":1,"pid":{},"exit_status":{},"exited_at_ns":{}}})"
                     "\n",
                     c.pid, c.exit_status, c.exited_at_ns);
}

host::Result<Cleanup> parse_receipt(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return Error{"nesinit-deleted.json: expected a JSON object"};
  std::uint64_t u = 0;
  std::int64_t i = 0;
  Cleanup c;
  if (o["schema_version"].get_uint64().get(u) || u != 1) return Error{"nesinit-deleted.json: schema_version: expected 1"};
  if (o["pid"].get_uint64().get(u) || u > 0x7fffffff) return Error{"nesinit-deleted.json: pid: expected a pid"};
  c.pid = static_cast<pid_t>(u);
  if (o["exit_status"].get_uint64().get(u) || u > 0xffffffffu) return Error{"nesinit-deleted.json: exit_status: expected a u32"};
  c.exit_status = static_cast<std::uint32_t>(u);
  if (o["exited_at_ns"].get_int64().get(i)) return Error{"nesinit-deleted.json: exited_at_ns: expected an integer"};
  c.exited_at_ns = i;
  return c;
}

Cleanup cleanup_task(const fs::path& bundle) {
  Cleanup c;
  c.exit_status = 128 + SIGKILL;
  c.exited_at_ns = now_ns();
  // A Delete's receipt, when one answered already: the answer, identical, whether the task is
  // gone or the shim was killed between the answer and the removal (finished below).
  std::optional<Cleanup> receipt;
  if (auto t = base::read_small_file((bundle / kReceiptFile).c_str(), 4096))
    if (auto p = parse_receipt(*t)) receipt = *p;
  auto rec = load_task_record(bundle);
  if (!rec || !*rec) return receipt ? *receipt : c;
  const TaskRecord& r = **rec;
  c.pid = r.pid;
  if (r.container) {  // the pod's VM is its sandbox's: only the container's rootfs goes
    remove_task(bundle, r);
    return receipt ? *receipt : c;
  }
  if (same_process_alive(r.pid, r.pid_start)) {
    ::kill(-r.pid, SIGKILL);  // its session's process group: neshost
    ::kill(r.pid, SIGKILL);
  }
  // A replacement monitor (readopt) and the VMM, which outlive `neshost run`.
  if (auto st = host::reconcile(r.state_dir, r.vm); st && *st && (*st)->monitor_alive && (*st)->monitor) {
    Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, (*st)->monitor->monitor.pid, 0))};
    if (pidfd && host::is_alive((*st)->monitor->monitor)) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
  kill_vmm(r);
  apply_recorded_exit(r, c.exit_status, c.exited_at_ns);
  remove_task(bundle, r);
  return receipt ? *receipt : c;
}

namespace {

/// The first of a request's stdin/stdout/stderr that names a scheme other than file:// (a FIFO
/// path has none; containerd's binary:// loggers are not supported), or null.
template <class Req>
const std::string* unsupported_stdio(const Req& req) {
  for (const std::string* io : {&req.stdin(), &req.stdout(), &req.stderr()})
    if (io->find("://") != std::string::npos && !io->starts_with("file://")) return io;
  return nullptr;
}

/// The `exec` request for an exec's process `spec` (its number is the monitor's to give): its
/// stdin attached when it has one; with a `terminal`, a PTY of `size` (height, width; 24x80
/// unless a ResizePty came before it started).
proto::ExecProcess exec_message(const TaskSpec& spec, bool attach_stdin, bool terminal,
                                std::optional<std::pair<std::uint32_t, std::uint32_t>> size) {
  proto::ExecProcess m;
  m.proc = 1;  // the monitor numbers it
  m.exec.argv = spec.argv;
  for (const auto& kv : spec.env) {
    auto eq = kv.find('=');
    m.exec.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  m.exec.cwd = spec.cwd;
  m.exec.uid = spec.uid;
  m.exec.gid = spec.gid;
  m.exec.groups = spec.groups;
  m.stdio = proto::Stdio{};
  m.stdio->attach_stdin = attach_stdin;
  if (terminal) {
    auto [h, w] = size.value_or(std::pair<std::uint32_t, std::uint32_t>{24, 80});
    m.stdio->terminal = proto::Terminal{static_cast<std::uint16_t>(h), static_cast<std::uint16_t>(w)};
  }
  return m;
}

}  // namespace

// ---- the service ----

struct TaskService::Impl {
  Impl(asio::io_context& io, ServiceConfig cfg, Publisher& events) : io(io), cfg(std::move(cfg)), events(events) {
    task.id = this->cfg.id;
  }
  asio::io_context& io;
  ServiceConfig cfg;
  Publisher& events;

  Process task;  // the task's own: neshost run (its pid is rec.pid once started)
  TaskRecord rec;
  TaskSpec spec;
  Fd pidfd;
  /// The replacement monitor serving the VM after `neshost run` died (readopt()); not our child.
  std::optional<host::ProcessIdentity> adopted;
  bool restored = false;  // restore(): rec.pid is not our child (signalled by identity only)
  // Threads asking the guest for its processes (each bounded by the control socket's timeout);
  // joined before the service goes.
  std::list<std::thread> askers;
  ~Impl() {
    for (auto& t : askers)
      if (t.joinable()) t.join();
  }
  std::optional<asio::posix::stream_descriptor> exit_watch;
  std::optional<cli::control::Resize> pending_resize;  // not yet taken by neshost run
  std::chrono::steady_clock::time_point resize_deadline;
  asio::steady_timer resize_timer{io};
  asio::steady_timer kill_timer{io};  // SIGKILL's deadline for the guest

  // ---- Exec: more processes in the task's VM (docs/containerd.md "Exec") ----
  // Each runs through the VM's monitor (`neshost run`): its control socket takes an `exec`
  // request with containerd's FIFOs for the process (SCM_RIGHTS) and answers on the same
  // connection "ok started PID PROC", then "ok exit STATUS" (host/monitor/control.hpp). The shim
  // reads that connection on its loop; Kill and ResizePty go to the control socket naming PROC.
  // The Process part: its id, pid (in the guest), stdio, phase, exit, stdin hold, waiters.
  // A pod's container is one too (its own process, exec_id empty): the monitor starts it with
  // `exec.container` (its root under the pod's share), and its execs join it with `exec.in`.
  struct ExecProc : Process {
    /// Exec `exec_id` of task `task_id`, or with `exec_id` empty the pod's container `task_id`.
    ExecProc(asio::io_context& io, std::string task_id, std::string exec_id)
        : sock(io), buf(std::make_shared<asio::streambuf>(64u << 10)) {
      exec = !exec_id.empty();
      id = exec ? std::move(exec_id) : task_id;
      task = std::move(task_id);
      phase = Phase::created;
    }
    std::string task;  // the task it belongs to: the shim's own, or a pod's container
    TaskSpec spec;
    std::string spec_json;  // containerd's OCI process JSON, for the exec journal
    bool restored = false;  // running when a replaced shim took it over from the journal (its start was published)
    bool stdin_closed = false;  // CloseIO came (journaled: a replacement holds no writer)
    // A pod's container only: its bundle, its record there (its rootfs under the pod's share),
    // its root and hostname as the guest names them.
    fs::path bundle;
    TaskRecord rec;
    std::string guest_root;
    std::optional<std::string> hostname;
    std::uint16_t proc = 0;       // the monitor's number for it (0 until started)
    asio::local::stream_protocol::socket sock;
    // Shared with the read in flight: a read cancelled by close() still completes into it, after
    // Delete may have freed the process.
    std::shared_ptr<asio::streambuf> buf;
    std::optional<ttrpc::Respond> start_respond;
    std::optional<std::pair<std::uint32_t, std::uint32_t>> pending_resize;  // height, width before it started
    std::optional<std::uint32_t> pending_signal;  // a Kill that came while its Start was in flight
    // Until the monitor's control socket takes the request (a VM just started has none yet).
    cli::control::Exec request;
    Fd in, out, err;
    std::optional<asio::steady_timer> retry;
    std::chrono::steady_clock::time_point connect_deadline;
    // Its end not yet journaled (announce_end): the next try, and how many failed.
    std::optional<asio::steady_timer> end_retry;
    unsigned end_tries = 0;
  };
  static constexpr std::size_t kMaxExecs = kExecLiveMax;  // per task, as the guest's own bound (proto::kExecMax)
  /// (task id, exec id): an exec; (container id, ""): a pod's container.
  using Key = std::pair<std::string, std::string>;
  std::map<Key, std::unique_ptr<ExecProc>> procs;
  /// The task is a pod's sandbox (its config.json says so): it serves the pod's containers.
  bool pod = false;
  /// What Delete answered for each deleted exec and pod container, so a retry gets the same
  /// (at most kMaxReceipts, the oldest forgotten first).
  static constexpr std::size_t kMaxReceipts = 1024;
  std::map<Key, v2::DeleteResponse> receipts;
  std::vector<Key> receipt_order;
  void keep_receipt(const Key& k, const v2::DeleteResponse& r) {
    if (receipts.emplace(k, r).second) receipt_order.push_back(k);
    if (receipt_order.size() > kMaxReceipts) {
      receipts.erase(receipt_order.front());
      receipt_order.erase(receipt_order.begin());
    }
  }
  /// A reused id is a new process: its old receipt goes (from the order too).
  void forget_receipt(const Key& k) {
    if (receipts.erase(k)) std::erase(receipt_order, k);
  }
  /// A Timestamp as CLOCK_REALTIME ns (set_time's inverse).
  static std::int64_t ns_of(const google::protobuf::Timestamp& t) {
    return static_cast<std::int64_t>(t.seconds()) * 1000000000 + t.nanos();
  }
  /// Delete's answer for `pid` that ended with `status` at `at_ns`: a receipt read back.
  static v2::DeleteResponse receipt_response(std::uint32_t pid, std::uint32_t status, std::int64_t at_ns) {
    v2::DeleteResponse r;
    r.set_pid(pid);
    r.set_exit_status(status);
    set_time(r.mutable_exited_at(), at_ns);
    return r;
  }
  /// The receipt in `bundle`, durably, for `shim delete` after this shim is gone (and a retry
  /// that reaches a replacement). `point`: its fault point (durable.hpp). Errors name the file.
  static host::Status write_receipt(std::string_view point, const fs::path& bundle, const v2::DeleteResponse& r) {
    return write_durable_at(point, bundle, kReceiptFile,
                            encode_receipt(Cleanup{static_cast<pid_t>(r.pid()), r.exit_status(), ns_of(r.exited_at())}));
  }

  /// Writes the exec journal (host/shim/exec_journal.hpp) from what the shim knows now: every
  /// process in `procs` (the task's execs; a pod's containers and their execs) and the newest
  /// kExecReceiptsKept receipts of deleted ones. A spec is kept only until its process started.
  /// `point`: the write's fault point (durable.hpp: "journal:exec-add", ...). Errors:
  /// write_durable's, naming the file and the errno.
  host::Status persist_execs(std::string_view point) {
    // A pod's sandbox deleted before its containers: its bundle, the journal's home, is
    // containerd's to remove once that Delete answered (no replacement shim can restore the pod
    // from it); each remaining container's receipt is written in its own bundle before its
    // Delete answers (delete_container), which is what `shim delete` and a retry read.
    if (task.phase == Phase::deleted) return host::Ok{};
    std::vector<ExecEntry> out;
    for (const auto& [k, x] : procs) {
      const bool unstarted = x->phase == Phase::created;
      ExecEntry e;
      e.id = x->id;
      if (unstarted) e.spec = x->spec_json;
      e.stdin_path = x->stdin_path;
      e.stdout_path = x->stdout_path;
      e.stderr_path = x->stderr_path;
      e.terminal = x->terminal;
      e.stdin_closed = x->stdin_closed;
      if (x->task != cfg.id && x->exec) e.task = x->task;
      if (!x->exec) {
        e.container = true;
        e.bundle = x->bundle.string();
      }
      e.state = x->phase == Phase::running   ? ExecState::running
                : x->phase == Phase::stopped ? ExecState::stopped
                : x->start_respond           ? ExecState::starting
                                             : ExecState::added;
      e.proc = x->proc;
      e.pid = x->pid;
      e.exit_status = x->exit_status;
      e.exited_at_ns = x->exited_at_ns;
      out.push_back(std::move(e));
    }
    // The newest kExecReceiptsKept receipts, written oldest first (the order restore keeps them in).
    std::vector<ExecEntry> deleted;
    for (auto it = receipt_order.rbegin(); it != receipt_order.rend() && deleted.size() < kExecReceiptsKept; ++it) {
      if (procs.count(*it)) continue;
      const v2::DeleteResponse& r = receipts.at(*it);
      ExecEntry e;
      // (task, exec id): an exec of the task or of a pod's container; (container, ""): a container.
      if (it->second.empty()) {
        e.id = it->first;
        e.container = true;
      } else {
        e.id = it->second;
        if (it->first != cfg.id) e.task = it->first;
      }
      e.state = ExecState::deleted;
      e.pid = r.pid();
      e.exit_status = r.exit_status();
      e.exited_at_ns = ns_of(r.exited_at());
      deleted.push_back(std::move(e));
    }
    // Within what restore reads (kExecJournalEntriesMax, kExecJournalMax): the oldest receipts
    // go first; a journal of live processes alone over the bounds is an error (the call that
    // would add one fails).
    const std::size_t live = out.size();
    out.insert(out.end(), std::make_move_iterator(deleted.rbegin()), std::make_move_iterator(deleted.rend()));
    std::string text = encode_exec_journal(out);
    while ((out.size() > kExecJournalEntriesMax || text.size() > kExecJournalMax) && out.size() > live) {
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(live));
      text = encode_exec_journal(out);
    }
    if (out.size() > kExecJournalEntriesMax || text.size() > kExecJournalMax)
      return Error{fmt::format("{}: {} processes, {} bytes: over its bounds ({} entries, {} bytes)", kExecJournalFile,
                               out.size(), text.size(), kExecJournalEntriesMax, kExecJournalMax)};
    return write_durable_at(point, cfg.bundle, kExecJournalFile, text);
  }
  /// persist_execs(), its failure a warning in the shim's log (what a later replacement would
  /// not know).
  void note_execs(std::string_view point) {
    if (auto w = persist_execs(point); !w)
      log("warning: task {}: exec journal: {}", cfg.id, w.error().message);
  }

  ExecProc* find_proc(const Key& k) {
    auto it = procs.find(k);
    return it == procs.end() ? nullptr : it->second.get();
  }
  static Key key(const ExecProc& x) { return {x.task, x.exec ? x.id : std::string()}; }

  /// check_id for a call that may name an exec or a pod's container: the shim's own task must
  /// exist, or `id` be one of the pod's containers; a non-empty exec_id must be one of that
  /// task's execs. `out`: the exec or container named, null for the shim's own task.
  ttrpc::Reply check_exec(const std::string& id, const std::string& exec_id, ExecProc** out) {
    *out = nullptr;
    if (id == cfg.id) {
      if (auto c = check_id(id, {}); !c.status.ok()) return c;
      if (exec_id.empty()) return empty();
    } else {
      ExecProc* c = find_proc({id, {}});
      if (!c) return fail(ttrpc::Code::not_found, fmt::format("task {}: not found", id));
      if (exec_id.empty()) {
        *out = c;
        return empty();
      }
    }
    *out = find_proc({id, exec_id});
    if (!*out) return fail(ttrpc::Code::not_found, fmt::format("exec {}: not found", exec_id));
    return empty();
  }

  /// The bundle State reports for `x`'s task.
  const fs::path& bundle_of(const ExecProc* x) {
    if (!x || x->task == cfg.id) return cfg.bundle;
    ExecProc* c = x->exec ? find_proc({x->task, {}}) : nullptr;
    return c ? c->bundle : x->bundle;
  }

  /// The process a call names: exec `x`, or the task's own when none.
  Process& process(ExecProc* x) { return x ? static_cast<Process&>(*x) : task; }

  ttrpc::Reply exec_add(const std::string& p) {
    auto req = parse<v2::ExecProcessRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ExecProcessRequest: malformed");
    ExecProc* in = nullptr;  // a pod's container it runs in
    if (auto c = check_exec(req->id(), {}, &in); !c.status.ok()) return c;
    if (process(in).phase != Phase::running)
      return fail(ttrpc::Code::failed_precondition, fmt::format("task {}: not running", req->id()));
    if (req->exec_id().empty() || req->exec_id().size() > 256)
      return fail(ttrpc::Code::invalid_argument, "exec_id: expected 1..256 bytes");
    if (find_proc({req->id(), req->exec_id()}))
      return fail(ttrpc::Code::already_exists, fmt::format("exec {}: already exists", req->exec_id()));
    forget_receipt({req->id(), req->exec_id()});
    std::size_t n = 0;
    for (const auto& [k, x] : procs) n += k.first == req->id() && x->exec;
    if (n >= kMaxExecs)
      return fail(ttrpc::Code::resource_exhausted, fmt::format("exec: {} execs exist already (delete ended ones)", kMaxExecs));
    if (const std::string* io = unsupported_stdio(*req))
      return fail(ttrpc::Code::invalid_argument, fmt::format("stdio '{}': only FIFO paths and file:// are supported", *io));
    if (req->spec().value().size() > kExecSpecMax)
      return fail(ttrpc::Code::invalid_argument,
                  fmt::format("spec: {} bytes, over {}: the VM's monitor takes an exec request of at most 64 KiB",
                              req->spec().value().size(), kExecSpecMax));
    auto sp = parse_oci_process(req->spec().value());
    if (!sp) return fail(ttrpc::Code::invalid_argument, "spec: " + sp.error().message);
    auto x = std::make_unique<ExecProc>(io, req->id(), req->exec_id());
    x->spec = std::move(*sp);
    x->spec_json = req->spec().value();
    x->stdin_path = req->stdin();
    x->stdout_path = req->stdout();
    x->stderr_path = req->stderr();
    x->terminal = req->terminal() || x->spec.terminal;
    const Key k = key(*x);
    procs.emplace(k, std::move(x));
    // Journaled before it is answered: a replacement shim can start what containerd was told exists.
    if (auto w = persist_execs("journal:exec-add"); !w) {
      procs.erase(k);
      return fail(ttrpc::Code::internal, fmt::format("exec {}: journal: {}", req->exec_id(), w.error().message));
    }
    ev::TaskExecAdded e;
    e.set_container_id(req->id());
    e.set_exec_id(req->exec_id());
    events.publish("/tasks/exec-added", e);
    return empty();
  }

  void start_any(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::StartRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "StartRequest: malformed"));
    if (req->exec_id().empty() && req->id() == cfg.id) return respond(start(c.payload));
    ExecProc* x = nullptr;
    if (auto r = check_exec(req->id(), req->exec_id(), &x); !r.status.ok()) return respond(std::move(r));
    if (x->phase != Phase::created)
      return respond(fail(ttrpc::Code::failed_precondition, fmt::format("{} {}: already started", x->exec ? "exec" : "task", x->id)));
    if (task.phase != Phase::running)
      return respond(fail(ttrpc::Code::failed_precondition,
                          x->task == cfg.id ? fmt::format("task {}: not running", cfg.id)
                                            : fmt::format("container '{}': sandbox '{}' is not running", x->task, cfg.id)));
    std::optional<std::uint16_t> in;  // an exec in a pod's container joins it
    if (x->exec && x->task != cfg.id) {
      ExecProc* c = find_proc({x->task, {}});
      if (!c || c->phase != Phase::running || c->proc == 0)
        return respond(fail(ttrpc::Code::failed_precondition, fmt::format("task {}: not running", x->task)));
      in = c->proc;
    }
    auto streams = x->open_streams();
    if (!streams) return respond(fail(ttrpc::Code::invalid_argument, streams.error().message));
    proto::ExecProcess m = exec_message(x->spec, !x->stdin_path.empty(), x->terminal, x->pending_resize);
    if (!x->exec) m.container = proto::Container{x->guest_root, x->hostname, x->spec.root_ro};
    m.in = in;
    if (auto ok = proto::validate(proto::HostMessage{m}); !ok)
      return respond(fail(ttrpc::Code::invalid_argument, "spec: " + ok.error().reason));
    x->request = cli::control::Exec{false, false, false, std::move(m)};  // `exec - JSON`
    x->in = std::move(streams->in);
    x->out = std::move(streams->out);
    x->err = std::move(streams->err);
    x->start_respond = std::move(respond);
    x->restored = false;  // an added one taken over: this Start's answer is published as any
    x->connect_deadline = std::chrono::steady_clock::now() + 30s;
    // Intent before effect: the journal says it is starting before the request can reach the
    // monitor (a replacement then knows the answer was lost, docs/containerd.md).
    {
      if (auto w = persist_execs("journal:exec-start"); !w) {
        x->in.reset();
        x->out.reset();
        x->err.reset();
        auto rs = std::exchange(x->start_respond, std::nullopt);
        return (*rs)(fail(ttrpc::Code::internal, fmt::format("exec {}: journal: {}", x->id, w.error().message)));
      }
      fault_point("exec:recorded");
    }
    connect_exec(key(*x));
  }

  /// Sends exec `id`'s request to the VM's monitor. A task just started may not have its control
  /// socket yet (`neshost run` is setting up): tried again every 20 ms for up to 30 s, as
  /// deliver_resize does.
  void connect_exec(const Key& id) {
    ExecProc* x = find_proc(id);
    if (!x || !x->start_respond) return;
    const auto path = host::control_path(rec.state_dir, rec.vm);
    std::error_code fe;
    const bool there = std::filesystem::exists(path, fe);
    auto cs = there ? cli::ControlSession::open(path, x->request, {x->in.get(), x->out.get(), x->err.get()})
                    : host::Result<cli::ControlSession>(Error{fmt::format("no monitor at {} yet", path.string())});
    if (!cs) {
      if (task.phase == Phase::running && std::chrono::steady_clock::now() < x->connect_deadline) {
        x->retry.emplace(io, 20ms);
        x->retry->async_wait([this, id](boost::system::error_code e) { if (!e) connect_exec(id); });
        return;
      }
      return exec_ended(*x, 125, cs.error().message);
    }
    // The monitor has its own copies now.
    x->in.reset();
    x->out.reset();
    x->err.reset();
    boost::system::error_code ec;
    Fd s = cs->take();
    x->sock.assign(asio::local::stream_protocol(), s.get(), ec);
    if (ec) return exec_ended(*x, 125, ec.message());
    s.release();
    read_exec(id);
  }

  /// The monitor's next line about exec `id` (its start, then its end).
  void read_exec(const Key& id) {
    ExecProc* x = find_proc(id);
    if (!x) return;
    asio::async_read_until(x->sock, *x->buf, '\n', [this, id, buf = x->buf](boost::system::error_code ec, std::size_t n) {
      ExecProc* x = find_proc(id);
      if (!x || x->buf != buf || ec == asio::error::operation_aborted) return;
      if (ec) return exec_ended(*x, 137, "the VM's monitor closed the connection");  // gone with the VM
      std::string line(asio::buffers_begin(buf->data()), asio::buffers_begin(buf->data()) + n - 1);
      buf->consume(n);
      auto reply = cli::control::parse_reply(line);
      if (!reply) return exec_ended(*x, 125, "unexpected answer: " + line);
      if (std::holds_alternative<cli::control::Waiting>(*reply)) return read_exec(id);  // the VM is still booting
      if (auto* started = std::get_if<cli::control::Started>(&*reply)) {
        if (x->restored) return read_exec(id);  // `wait PROC`: the start was published by the shim before
        const auto pid = static_cast<std::uint32_t>(started->pid);
        x->pid = pid;
        x->proc = started->proc;
        x->phase = Phase::running;
        // The result, durable before containerd hears it. Not durable: the process is ended in
        // the guest (SIGKILL: nothing runs that no journal names) and Start fails naming the
        // journal; nothing is published. The journal still says `starting`, which a replacement
        // reports as a failed Start (125), as containerd was told.
        if (auto w = persist_execs("journal:exec-started"); !w) {
          (void)cli::control_call(host::control_path(rec.state_dir, rec.vm), cli::control::Kill{SIGKILL, x->proc}, 2s);
          x->phase = Phase::created;
          x->pid = 0;
          auto rs = std::exchange(x->start_respond, std::nullopt);
          const std::string what = x->exec ? "exec " + x->id : fmt::format("container '{}'", x->id);
          exec_ended(*x, 125, "its start was not journaled: " + w.error().message);
          if (rs) (*rs)(fail(ttrpc::Code::internal, fmt::format("{}: journal: {}", what, w.error().message)));
          return;
        }
        if (x->exec) {
          ev::TaskExecStarted e;
          e.set_container_id(x->task);
          e.set_exec_id(x->id);
          e.set_pid(pid);
          events.publish("/tasks/exec-started", e);
        } else {  // a pod's container
          ev::TaskStart e;
          e.set_container_id(x->id);
          e.set_pid(pid);
          events.publish("/tasks/start", e);
        }
        v2::StartResponse r;
        r.set_pid(pid);
        if (auto rs = std::exchange(x->start_respond, std::nullopt)) (*rs)(ok(r));
        if (auto sz = std::exchange(x->pending_resize, std::nullopt))
          (void)cli::control_request(host::control_path(rec.state_dir, rec.vm),
                                     cli::control::Resize{static_cast<std::uint16_t>(sz->first),
                                                          static_cast<std::uint16_t>(sz->second), x->proc},
                                     2s);
        if (auto sig = std::exchange(x->pending_signal, std::nullopt)) (void)exec_kill(*x, *sig);
        return read_exec(id);
      }
      if (auto* exited = std::get_if<cli::control::Exited>(&*reply))
        return exec_ended(*x, static_cast<std::uint32_t>(exited->status), exited->why);
      if (auto* e = std::get_if<cli::control::Error>(&*reply)) return exec_ended(*x, 125, e->message);
      exec_ended(*x, 125, "unexpected answer: " + line);
    });
  }

  /// Exec `x` is over with `status` (`why`: what went wrong, if anything). If it never started,
  /// its Start fails with `why` instead (containerd reports that to the client), as runc's
  /// shim fails Start for an exec whose program cannot run. Told once its end is journaled
  /// (announce_end; `hold` false: at once, see there).
  void exec_ended(ExecProc& x, std::uint32_t status, std::string why, bool hold = true) {
    boost::system::error_code ig;
    x.sock.close(ig);
    const bool started = x.phase == Phase::running;
    // What went wrong after it ran (e.g. its output lost on the way to its FIFOs: 125) goes to
    // the shim's log, naming the task and the exec.
    if (started && !why.empty())
      log("warning: task {}{}: {} (exit status {})", x.task,
                 x.exec ? " exec " + x.id : std::string(), why, status);
    x.stop(status, now_ns());
    announce_end(key(x), started, std::move(why), hold);
  }

  /// Tells exec `k`'s end (exec_ended: its Start's failure answered, its /tasks/exit published,
  /// its waiters answered) once the journal holds it. A journal write that fails holds all of
  /// that back: the exec stays as it was before its end (State RUNNING, Wait waiting, Delete
  /// refused) and the write is tried again every second, said in the log at the first failure
  /// and when it succeeds. A replacement shim meanwhile finds it running in the journal and gets
  /// its end from the monitor (`wait PROC`: the last 64 ended processes' status). `hold` false (it
  /// ends with its container's Delete, which is durable by the container's receipt): told at
  /// once, the failure a warning.
  void announce_end(const Key& k, bool started, std::string why, bool hold) {
    ExecProc* xp = find_proc(k);
    if (!xp) return;
    ExecProc& x = *xp;
    const std::uint32_t status = x.exit_status;
    if (auto w = persist_execs("journal:exec-exit"); !w) {
      if (hold) {
        if (x.end_tries++ == 0)
          log("warning: task {}: {}: its end (exit status {}) is held until the exec journal takes it: {}", x.task,
              name(x), status, w.error().message);
        x.phase = started ? Phase::running : Phase::created;  // as before its end, until it is durable
        x.end_retry.emplace(io, 1s);
        x.end_retry->async_wait([this, k, started, why](boost::system::error_code e) {
          ExecProc* x = find_proc(k);
          if (e || !x) return;
          x->phase = Phase::stopped;
          announce_end(k, started, why, true);
        });
        return;
      }
      log("warning: task {}: {}: its end is told, not journaled: {}", x.task, name(x), w.error().message);
    }
    if (x.end_tries) log("task {}: {}: its end journaled after {} failed writes", x.task, name(x), x.end_tries);
    x.end_tries = 0;
    if (auto rs = std::exchange(x.start_respond, std::nullopt)) {
      (*rs)(fail(ttrpc::Code::failed_precondition,
                 fmt::format("{}: {}{}", x.exec ? "exec " + x.id : fmt::format("container '{}'", x.id),
                             why.empty() ? "did not start" : why, status == 127 ? " (not found)" : "")));
    }
    if (!started && x.pid == 0 && x.waiters.empty()) return;
    x.report_exit(events, x.task);
  }

  ttrpc::Reply exec_kill(ExecProc& x, std::uint32_t signal) {
    if (x.start_respond) {  // its Start is in flight: the signal goes once it runs
      x.pending_signal = signal;
      return empty();
    }
    if (x.phase != Phase::running || x.proc == 0) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: not started", name(x)));
    auto done = cli::control_call(host::control_path(rec.state_dir, rec.vm),
                                  cli::control::Kill{static_cast<int>(signal), x.proc}, 2s);
    if (done) return empty();
    return fail(ttrpc::Code::unavailable, fmt::format("kill {}: {}", signal, done.error().message));
  }

  /// "exec ID", or "task ID" for a pod's container: what a message calls `x`.
  static std::string name(const ExecProc& x) { return fmt::format("{} {}", x.exec ? "exec" : "task", x.id); }

  using Handler = ttrpc::Reply (Impl::*)(const std::string& payload);

  static ttrpc::Reply ok(const google::protobuf::Message& m) { return {{}, m.SerializeAsString()}; }
  static ttrpc::Reply fail(ttrpc::Code c, std::string msg) { return {{c, std::move(msg)}, {}}; }
  static ttrpc::Reply empty() { return {{}, {}}; }

  template <class Req>
  static std::optional<Req> parse(const std::string& p) {
    Req r;
    if (!r.ParseFromString(p)) return std::nullopt;
    return r;
  }

  ttrpc::Reply check_id(const std::string& id, const std::string& exec_id) {
    if (task.phase == Phase::none || task.phase == Phase::deleted || id != cfg.id)
      return fail(ttrpc::Code::not_found, fmt::format("task {}: not found", id));
    if (!exec_id.empty()) return fail(ttrpc::Code::not_found, fmt::format("exec {}: not found", exec_id));
    return empty();
  }

  /// The task's record, durably (`point`: its fault point, durable.hpp). Errors name the file.
  host::Status persist(std::string_view point) {
    return write_durable_at(point, cfg.bundle, kTaskFile, encode_task_record(rec));
  }

  ttrpc::Reply create(const std::string& p) {
    auto req = parse<v2::CreateTaskRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "CreateTaskRequest: malformed");
    // Another task's id first: a pod's container sent to its sandbox's shim (host/shim/pod.hpp)
    // is not "already exists" because the sandbox is.
    if (req->id() != cfg.id) return create_container(*req);
    if (task.phase != Phase::none) return fail(ttrpc::Code::already_exists, fmt::format("task {}: already exists", req->id()));
    if (!req->checkpoint().empty()) return fail(ttrpc::Code::unimplemented, "checkpoint: restore is not supported");
    if (const std::string* io = unsupported_stdio(*req))
      return fail(ttrpc::Code::invalid_argument,
                  fmt::format("stdio '{}': only FIFO paths and file:// are supported (no binary:// loggers)", *io));
    if (!req->bundle().empty() && fs::path(req->bundle()) != cfg.bundle)
      return fail(ttrpc::Code::invalid_argument,
                  fmt::format("bundle: '{}' is not this shim's bundle '{}'", req->bundle(), cfg.bundle.string()));
    const fs::path bundle = cfg.bundle;
    auto text = read_oci_config(bundle);
    if (!text) return fail(ttrpc::Code::invalid_argument, text.error().message);
    auto s = parse_oci_spec(*text, bundle);
    if (!s) return fail(ttrpc::Code::invalid_argument, s.error().message);
    // A pod's sandbox (`shim start` already refused a bad placement): the VM of the pod, sized
    // for it.
    if (auto pl = parse_pod_placement(*text, cfg.id)) pod = pl->role == PodRole::sandbox;
    if (pod) {
      auto size = parse_pod_size(*text, cfg.id);
      if (!size) return fail(ttrpc::Code::invalid_argument, size.error().message);
      if (size->mem_mib != kPodBaseMemMib) s->mem_mib = size->mem_mib;
      if (size->cpus != kPodBaseCpus) s->cpus = size->cpus;
    }
    rec = TaskRecord{};
    std::error_code rc;
    fs::remove(bundle / kReceiptFile, rc);  // an earlier incarnation's answer is not this one's
    fs::remove(bundle / kExecJournalFile, rc);  // nor its execs
    rec.id = cfg.id;
    // A new incarnation: a VM id of its own (identity.hpp), said in the shim's log.
    const std::string incarnation = new_incarnation();
    rec.vm = incarnation_vm_id(cfg.ns, cfg.id, incarnation);
    log("task {}: incarnation {} (VM {})", cfg.id, incarnation, rec.vm);
    rec.state_dir = bundle / "nesinit-state";
    if (req->rootfs_size() > 1)
      return fail(ttrpc::Code::invalid_argument, fmt::format("rootfs: {} mounts; one is supported", req->rootfs_size()));
    // Intent before effect: the record names every mount this Create may make before it makes
    // one, so a shim killed in between leaves `shim delete` a record to undo it by (an unmount
    // of what was not mounted yet fails harmlessly); never a mount nobody knows of.
    rec.mounted_rootfs = req->rootfs_size() == 1;
    rec.stdin_path = req->stdin();
    rec.stdout_path = req->stdout();
    rec.stderr_path = req->stderr();
    rec.terminal = req->terminal();
    if (pod) rec.pod_share = bundle / kPodShareDir;
    if (auto w = persist("record:create"); !w) return fail(ttrpc::Code::internal, w.error().message);
    if (req->rootfs_size() == 1) {
      std::error_code ec;
      fs::create_directories(bundle / "rootfs", ec);
      if (auto m = mount_rootfs(req->rootfs(0), bundle / "rootfs"); !m) {
        remove_task(bundle, rec);
        return fail(ttrpc::Code::invalid_argument, m.error().message);
      }
      fault_point("create:mounted");
    }
    std::error_code ec;
    if (!fs::is_directory(s->root, ec)) {
      remove_task(bundle, rec);
      return fail(ttrpc::Code::invalid_argument, fmt::format("root.path: {} is not a directory", s->root.string()));
    }
    // A read-only root gets its mount points first, as runc makes them (the guest cannot).
    if (s->root_ro)
      if (auto m = make_mount_points(s->root, s->volumes); !m) {
        remove_task(bundle, rec);
        return fail(ttrpc::Code::invalid_argument, m.error().message);
      }
    if (pod) {
      // The pod's share: a bind of the directory on itself made shared, so the containers'
      // rootfs mounted under it later reach virtiofsd's mount namespace (a slave of it).
      // It is a read-only view of the shim's own directory (pod_share_real), made private
      // first so it starts a peer group of its own rather than joining its parent's.
      const fs::path real = pod_share_real(rec.pod_share);
      fs::create_directories(real, ec);
      if (!ec) fs::create_directories(rec.pod_share, ec);
      const char* at = rec.pod_share.c_str();
      if (ec || ::mount(real.c_str(), at, nullptr, MS_BIND, nullptr) != 0 ||
          ::mount(nullptr, at, nullptr, MS_PRIVATE, nullptr) != 0 || ::mount(nullptr, at, nullptr, MS_SHARED, nullptr) != 0 ||
          ::mount(nullptr, at, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) {
        std::string why = ec ? ec.message() : std::strerror(errno);
        remove_task(bundle, rec);
        return fail(ttrpc::Code::internal, fmt::format("pod share {}: {}", rec.pod_share.string(), why));
      }
      fault_point("create:pod-share");
      s->volumes.push_back(Volume{rec.pod_share, std::string(kPodShareGuest), false});
    }
    // Done: what a replaced shim restores as CREATED (restore()).
    rec.created = true;
    if (auto w = persist("record:created"); !w) {
      remove_task(bundle, rec);
      return fail(ttrpc::Code::internal, w.error().message);
    }
    spec = std::move(*s);
    task.stdin_path = req->stdin();
    task.stdout_path = req->stdout();
    task.stderr_path = req->stderr();
    task.terminal = req->terminal();
    spec.terminal = task.terminal || spec.terminal;
    task.phase = Phase::created;
    ev::TaskCreate e;
    e.set_container_id(cfg.id);
    e.set_bundle(bundle.string());
    *e.mutable_rootfs() = req->rootfs();
    e.mutable_io()->set_stdin(task.stdin_path);
    e.mutable_io()->set_stdout(task.stdout_path);
    e.mutable_io()->set_stderr(task.stderr_path);
    e.mutable_io()->set_terminal(task.terminal);
    e.set_pid(static_cast<std::uint32_t>(::getpid()));
    events.publish("/tasks/create", e);
    v2::CreateTaskResponse r;
    r.set_pid(static_cast<std::uint32_t>(::getpid()));
    return ok(r);
  }

  /// Create of a pod's container (`req.id()` not the shim's own task): checked against its
  /// bundle's config.json (its annotations must name this shim's sandbox), its record written in
  /// its bundle before its rootfs is mounted under the pod's share (`<share>/<vm id of the
  /// container>/rootfs`), which is the guest's /run/nes/pod/.../rootfs. Errors name the
  /// container and the field; the pod and its other containers are untouched.
  ttrpc::Reply create_container(const v2::CreateTaskRequest& req) {
    const std::string& cid = req.id();
    auto refuse = [&](ttrpc::Code c, std::string_view field, const std::string& why) {
      return fail(c, fmt::format("container '{}': {}: {}", cid, field, why));
    };
    if (!pod)
      return refuse(ttrpc::Code::failed_precondition, "id",
                    fmt::format("this shim serves task '{}', which is not a pod's sandbox", cfg.id));
    if (find_proc({cid, {}})) return fail(ttrpc::Code::already_exists, fmt::format("task {}: already exists", cid));
    forget_receipt({cid, {}});  // a re-created container is a new task
    if (task.phase != Phase::created && task.phase != Phase::running)
      return refuse(ttrpc::Code::failed_precondition, kSandboxIdAnnotation,
                    fmt::format("sandbox '{}' has ended", cfg.id));
    if (!req.checkpoint().empty()) return refuse(ttrpc::Code::unimplemented, "checkpoint", "restore is not supported");
    if (const std::string* io = unsupported_stdio(req))
      return refuse(ttrpc::Code::invalid_argument, "stdio", fmt::format("'{}': only FIFO paths and file:// are supported", *io));
    if (req.bundle().empty() || req.bundle().front() != '/')
      return refuse(ttrpc::Code::invalid_argument, "bundle", "expected an absolute path");
    const fs::path bundle = req.bundle();
    auto text = read_oci_config(bundle);
    if (!text) return fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, text.error().message));
    auto pl = parse_pod_placement(*text, cid);
    if (!pl) return fail(ttrpc::Code::invalid_argument, pl.error().message);
    if (pl->role != PodRole::container || pl->sandbox_id != cfg.id)
      return refuse(ttrpc::Code::invalid_argument, fmt::format("annotations.{}", kSandboxIdAnnotation),
                    pl->role == PodRole::container
                        ? fmt::format("sandbox '{}' is not this shim's pod (sandbox '{}')", pl->sandbox_id, cfg.id)
                        : fmt::format("expected a container of sandbox '{}' ({} 'container')", cfg.id, kContainerTypeAnnotation));
    auto sp = parse_oci_spec(*text, bundle);
    if (!sp) return fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, sp.error().message));
    // The guest gives every container the VM's /etc/hosts, /etc/resolv.conf and /etc/hostname
    // (what CRI binds from the sandbox's own); other binds are not carried into a pod's VM yet.
    for (std::size_t i = 0; i < sp->volumes.size(); ++i) {
      const auto& g = sp->volumes[i].guest;
      if (g != "/etc/hosts" && g != "/etc/resolv.conf" && g != "/etc/hostname")
        return refuse(ttrpc::Code::invalid_argument, "mounts",
                      fmt::format("a bind at {} is not supported for a pod's container yet (docs/containerd.md \"Pods\")", g));
    }
    if (req.rootfs_size() > 1)
      return refuse(ttrpc::Code::invalid_argument, "rootfs", fmt::format("{} mounts; one is supported", req.rootfs_size()));
    auto x = std::make_unique<ExecProc>(io, cid, std::string());
    const std::string dir = vm_id(cfg.ns, cid);
    x->bundle = bundle;
    x->rec.id = cid;
    x->rec.vm = rec.vm;
    x->rec.state_dir = rec.state_dir;
    x->rec.pod_share = rec.pod_share / dir / "rootfs";
    x->rec.container = true;
    x->guest_root = fmt::format("{}/{}/rootfs", kPodShareGuest, dir);
    std::error_code rc;
    fs::remove(bundle / kReceiptFile, rc);  // an earlier incarnation's answer is not this one's
    // Intent before effect: the record first, so `shim delete` finds whatever gets mounted.
    if (auto w = write_durable_at("record:container-create", bundle, kTaskFile, encode_task_record(x->rec)); !w)
      return refuse(ttrpc::Code::internal, "bundle", w.error().message);
    // The mount point in the shim's own directory; the mount on the view (what propagates).
    std::error_code ec;
    const fs::path real = pod_share_real(rec.pod_share, fs::path(dir) / "rootfs");
    fs::create_directories(real, ec);
    host::Status m = host::Ok{};
    if (ec) m = Error{fmt::format("rootfs: mkdir {}: {}", real.string(), ec.message())};
    else if (req.rootfs_size() == 1) m = mount_rootfs(req.rootfs(0), x->rec.pod_share);
    else if (::mount(sp->root.c_str(), x->rec.pod_share.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      m = Error{fmt::format("root.path: bind {} on {}: {}", sp->root.string(), x->rec.pod_share.string(), std::strerror(errno))};
    if (!m) {
      remove_task(bundle, x->rec);
      return fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, m.error().message));
    }
    if (!sp->hostname.empty()) x->hostname = sp->hostname;
    else if (!spec.hostname.empty()) x->hostname = spec.hostname;
    x->stdin_path = req.stdin();
    x->stdout_path = req.stdout();
    x->stderr_path = req.stderr();
    x->terminal = req.terminal() || sp->terminal;
    x->spec = std::move(*sp);
    ev::TaskCreate e;
    e.set_container_id(cid);
    e.set_bundle(bundle.string());
    *e.mutable_rootfs() = req.rootfs();
    e.mutable_io()->set_stdin(x->stdin_path);
    e.mutable_io()->set_stdout(x->stdout_path);
    e.mutable_io()->set_stderr(x->stderr_path);
    e.mutable_io()->set_terminal(x->terminal);
    e.set_pid(static_cast<std::uint32_t>(::getpid()));
    const Key k = key(*x);
    const TaskRecord made = x->rec;
    procs.emplace(k, std::move(x));
    // The pod's journal before the answer: a replaced shim serves this container too.
    if (auto w = persist_execs("journal:container-create"); !w) {
      procs.erase(k);
      remove_task(bundle, made);
      return refuse(ttrpc::Code::internal, "journal", w.error().message);
    }
    events.publish("/tasks/create", e);
    v2::CreateTaskResponse r;
    r.set_pid(static_cast<std::uint32_t>(::getpid()));
    return ok(r);
  }

  /// Delete of a pod's container that is not running: its receipt written in its bundle first
  /// (its failure fails the Delete, nothing removed or told: the error names the file), then its
  /// execs go with it, its rootfs is unmounted from the pod's share, its record removed;
  /// /tasks/delete published.
  host::Result<v2::DeleteResponse> delete_container(ExecProc& c) {
    v2::DeleteResponse r = c.delete_response();
    if (auto w = write_receipt("receipt:container-delete", c.bundle, r); !w)
      return Error{fmt::format("container '{}': delete: receipt: {}", c.id, w.error().message)};
    for (auto it = procs.begin(); it != procs.end();) {
      if (it->first.first == c.id && it->second->exec) {
        // Gone with its container (its pid namespace ended): its exit told, its Start answered.
        if (it->second->phase != Phase::stopped) exec_ended(*it->second, 137, "its container was deleted", false);
        it = procs.erase(it);
      } else {
        ++it;
      }
    }
    boost::system::error_code ig;
    c.sock.close(ig);
    remove_task(c.bundle, c.rec);
    ev::TaskDelete e;
    e.set_container_id(c.id);
    e.set_pid(r.pid());
    e.set_exit_status(r.exit_status());
    *e.mutable_exited_at() = r.exited_at();
    events.publish("/tasks/delete", e);
    procs.erase(key(c));
    // Its receipt, its execs gone. A failure leaves the journal naming it stopped; a replacement
    // then finds its record gone and its receipt in its bundle, and answers with that receipt.
    note_execs("journal:container-delete");
    return r;
  }

  ttrpc::Reply start(const std::string& p) {
    auto req = parse<v2::StartRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "StartRequest: malformed");
    if (auto c = check_id(req->id(), req->exec_id()); !c.status.ok()) return c;
    if (task.phase != Phase::created) return fail(ttrpc::Code::failed_precondition, fmt::format("task {}: already started", cfg.id));
    auto streams = task.open_streams();
    if (!streams) return fail(ttrpc::Code::invalid_argument, streams.error().message);
    RunPlan plan{rec.vm, rec.state_dir, !task.stdin_path.empty()};
    // Intent before effect: the monitor's pid is recorded while it waits at its gate, so a shim
    // killed at any point leaves `shim delete` the process to end, and one killed before the
    // record leaves a child that exits at the closed gate having run nothing.
    auto spawned = spawn_gated(cfg.neshost.string(), run_args(spec, plan), *streams);
    if (!spawned) return fail(ttrpc::Code::internal, spawned.error().message);
    const pid_t pid = spawned->pid;
    pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    int watch_fd = pidfd ? ::fcntl(pidfd.get(), F_DUPFD_CLOEXEC, 3) : -1;
    rec.pid = pid;
    const auto pid_start = start_time(pid);
    rec.pid_start = pid_start.value_or(0);
    // Without its start time the record's pid is no identity `shim delete` could act on.
    auto w = watch_fd < 0  ? host::Status{Error{fmt::format("pidfd_open: {}", std::strerror(errno))}}
             : !pid_start ? host::Status{Error{fmt::format("/proc/{}/stat: no start time", pid)}}
                          : persist("record:start");
    if (w) {
      fault_point("start:recorded");
      w = release(*spawned, cfg.neshost.string());
    }
    if (!w) {
      // Not recorded (`shim delete` could not find the VM), no pidfd (nobody would see it end) or
      // not run (execve failed): the child ends here, its gate closed, having started no VM.
      // Reaped here (SIGKILL: bounded).
      if (watch_fd >= 0) ::close(watch_fd);
      spawned->gate.reset();
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
      rec.pid = 0;
      rec.pid_start = 0;
      (void)persist("record:start-undone");
      pidfd.reset();
      return fail(ttrpc::Code::internal, w.error().message);
    }
    task.phase = Phase::running;
    task.pid = static_cast<std::uint32_t>(pid);
    watch_exit(watch_fd);
    ev::TaskStart e;
    e.set_container_id(cfg.id);
    e.set_pid(static_cast<std::uint32_t>(pid));
    events.publish("/tasks/start", e);
    v2::StartResponse r;
    r.set_pid(static_cast<std::uint32_t>(pid));
    return ok(r);
  }

  void kill_session() {
    if (task.phase != Phase::running) return;
    // Our child cannot be reaped behind our back; a re-adopted `neshost run` (restore()) can,
    // and its pid be reused: signalled only while it is the recorded process.
    if (!restored || same_process_alive(rec.pid, rec.pid_start)) {
      ::kill(-rec.pid, SIGKILL);  // neshost's session
      ::kill(rec.pid, SIGKILL);
    }
    if (adopted) {
      Fd p{static_cast<int>(::syscall(SYS_pidfd_open, adopted->pid, 0))};
      if (p && host::is_alive(*adopted)) ::syscall(SYS_pidfd_send_signal, p.get(), SIGKILL, nullptr, 0);
    }
    kill_vmm(rec);  // QEMU and its daemons outlive neshost (--vmm-outlives)
  }

  /// A shim started again on a bundle whose task's monitor still runs (the one before was
  /// SIGKILLed; containerd, restarted, finds this one at the bundle's address): the task as its
  /// record says, RUNNING with the same pid. Its `neshost run` is not our child: watched by its
  /// pidfd, its exit status the VM's outcome record's (as a replacement monitor's). Its stdio
  /// stays as it was (containerd's FIFOs or files are the monitor's own fds: nothing of the
  /// shim's is on that path, so no byte is lost or repeated); its stdin FIFO is held again as
  /// Start holds it (CloseIO works). Its execs as the exec journal names them (restore_execs). A
  /// task whose Create finished and that was never started: CREATED again. A deleted one (its
  /// receipt in the bundle): deleted, a retried Delete answered with the receipt. A pod's sandbox
  /// as any task, its containers and their execs from the journal. A pod's container's own
  /// record, another task's record, a Create cut short, or a record without a live monitor: nothing
  /// (containerd's cleanup ends them). Returns what it did, for the shim's log.
  std::optional<std::string> restore() {
    // A task whose Delete answered (its receipt written first) and whose shim died before or
    // after the removal: deleted, its receipt the answer to a retried Delete, the removal done.
    if (auto t = base::read_small_file((cfg.bundle / kReceiptFile).c_str(), 4096)) {
      if (auto c = parse_receipt(*t)) {
        if (auto r = load_task_record(cfg.bundle); r && *r && (*r)->id == cfg.id && !(*r)->container)
          remove_task(cfg.bundle, **r);
        task.phase = Phase::deleted;
        task.pid = static_cast<std::uint32_t>(c->pid);
        task.exit_status = c->exit_status;
        task.exited_at_ns = c->exited_at_ns;
        return fmt::format("deleted: its receipt (exit status {}) answers Delete", c->exit_status);
      }
    }
    auto r = load_task_record(cfg.bundle);
    if (!r || !*r) return std::nullopt;
    TaskRecord got = std::move(**r);
    if (got.id != cfg.id || got.container) return std::nullopt;
    const bool is_pod = !got.pod_share.empty();  // a sandbox: its containers come back from the journal
    auto text = read_oci_config(cfg.bundle);
    if (!text) return std::nullopt;
    auto s = parse_oci_spec(*text, cfg.bundle);
    if (!s) return std::nullopt;
    if (got.pid <= 0) {
      // Created, not started: CREATED again (Start spawns the monitor as ever); its pid is now
      // this shim's, as a Created task's is.
      // A pod's sandbox never started is not: its VM's size and share are Create's work.
      if (!got.created || is_pod) return std::nullopt;
      rec = std::move(got);
      spec = std::move(*s);
      task.phase = Phase::created;
      stdio_from_record();
      return fmt::format("restored from its record: created, VM {}", rec.vm);
    }
    Fd p{static_cast<int>(::syscall(SYS_pidfd_open, got.pid, 0))};
    auto id = host::identity_of(got.pid);
    // The pidfd first, the identity after: a recycled pid cannot pass for the monitor.
    if (!p || !id || id->start_time != got.pid_start) return std::nullopt;
    pod = is_pod;
    rec = std::move(got);
    spec = std::move(*s);
    task.phase = Phase::running;
    task.pid = static_cast<std::uint32_t>(rec.pid);
    stdio_from_record();
    if (rec.stdin_closed) {  // CloseIO came before: the monitor is told again, no writer of ours
      close_stdin_deadline = std::chrono::steady_clock::now() + 60s;
      deliver_close_stdin();
    } else {
      task.hold_stdin();  // as Start holds it (the monitor holds the read end)
    }
    restored = true;
    adopted = *id;
    watch_exit(p.release());
    std::string said = fmt::format("re-adopted from its record: monitor pid {}, VM {}", rec.pid, rec.vm);
    if (auto n = restore_execs(); !n.empty()) said += "; execs: " + n;
    return said;
  }

  /// The task's stdio paths and terminal as its record keeps them (restore()).
  void stdio_from_record() {
    task.stdin_path = rec.stdin_path;
    task.stdout_path = rec.stdout_path;
    task.stderr_path = rec.stderr_path;
    task.terminal = rec.terminal;
    spec.terminal = rec.terminal || spec.terminal;
  }

  /// The execs the journal names, taken over by restore() (host/shim/exec_journal.hpp): an added
  /// one as created (containerd may Start it), a running one waited for through the monitor
  /// (`wait PROC` on a connection of its own, read as Start's connection is: its end is this
  /// shim's to report), a stopped one with its status and time, a deleted one's receipt kept. One
  /// whose Start was in flight when the shim died (`starting`: its answer never reached
  /// containerd, which failed the Start) is stopped with 125 and a warning: the monitor cannot
  /// tell whether the request reached it. Returns a summary for the log ("" when none).
  std::string restore_execs() {
    auto text = base::read_small_file((cfg.bundle / kExecJournalFile).c_str(), kExecJournalMax);
    if (!text) {
      if (text.error().err != ENOENT)
        log("warning: task {}: {}: execs not restored", cfg.id,
                   text.error().message);
      return {};
    }
    auto j = parse_exec_journal(*text);
    if (!j) {
      log("warning: task {}: {}: execs not restored", cfg.id, j.error().message);
      return {};
    }
    // Every exec and receipt first, the journal written once, then the waits: an exec that
    // cannot be waited for ends (and journals) with everything else already in place.
    std::string out;
    std::vector<std::pair<Key, std::uint16_t>> to_wait;
    // Two passes: a pod's live containers first (an exec joins its container's process), then
    // everything else in the journal's order (its receipts oldest first, as they were kept).
    std::vector<ExecEntry*> order;
    for (auto& e : *j)
      if (e.container && e.state != ExecState::deleted) order.push_back(&e);
    for (auto& e : *j)
      if (!e.container || e.state == ExecState::deleted) order.push_back(&e);
    for (ExecEntry* ep : order) {
      ExecEntry& e = *ep;
      if (e.task == cfg.id) e.task.clear();  // the shim's own task, however written
      const std::string task_id = e.container ? e.id : e.task.empty() ? cfg.id : e.task;
      const std::string what = e.container ? fmt::format("container {}", e.id)
                               : e.task.empty() ? e.id
                                                : fmt::format("{} (in {})", e.id, e.task);
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", what, to_string(e.state));
      const Key k{task_id, e.container ? std::string() : e.id};
      if (procs.count(k) || receipts.count(k)) {  // a journal that names one process twice
        log("warning: task {}: {} named twice in the exec journal", cfg.id, what);
        continue;
      }
      if (e.state == ExecState::deleted) {
        keep_receipt(k, receipt_response(e.pid, e.exit_status, e.exited_at_ns));
        continue;
      }
      if (!e.container && task_id != cfg.id && !find_proc({task_id, {}})) {
        log("warning: task {}: exec {}: its container {} is not restored",
                   cfg.id, e.id, task_id);
        continue;
      }
      auto x = std::make_unique<ExecProc>(io, task_id, e.container ? std::string() : e.id);
      if (e.container) {
        // A pod's container: its record and config.json in its bundle say what Create made.
        x->bundle = e.bundle;
        auto crec = load_task_record(x->bundle);
        auto text = read_oci_config(x->bundle);
        auto sp = text ? parse_oci_spec(*text, x->bundle) : host::Result<TaskSpec>(text.error());
        if (crec && !*crec) {
          // Its Delete removed the record (the receipt in its bundle written first) and the shim
          // died before the journal said so: deleted, the receipt its answer.
          if (auto t = base::read_small_file((x->bundle / kReceiptFile).c_str(), 4096))
            if (auto c = parse_receipt(*t)) {
              keep_receipt(k, receipt_response(static_cast<std::uint32_t>(c->pid), c->exit_status, c->exited_at_ns));
              continue;
            }
        }
        if (!crec || !*crec || !(*crec)->container || !sp) {
          log("warning: task {}: container {}: its bundle {}: {}", cfg.id,
                     e.id, e.bundle, !crec ? crec.error().message : !*crec || !(*crec)->container ? "no container record"
                                                                                                 : sp.error().message);
          continue;
        }
        x->rec = std::move(**crec);
        x->guest_root = fmt::format("{}/{}/rootfs", kPodShareGuest, vm_id(cfg.ns, e.id));
        if (!sp->hostname.empty()) x->hostname = sp->hostname;
        else if (!spec.hostname.empty()) x->hostname = spec.hostname;
        x->spec = std::move(*sp);
      } else if (e.state == ExecState::added) {
        auto sp = parse_oci_process(e.spec);
        if (!sp) {  // nothing ran: as if never added
          log("warning: task {}: exec {}: spec: {}", cfg.id, e.id,
                     sp.error().message);
          continue;
        }
        x->spec = std::move(*sp);
        x->spec_json = std::move(e.spec);
      }
      x->stdin_path = e.stdin_path;
      x->stdout_path = e.stdout_path;
      x->stderr_path = e.stderr_path;
      x->terminal = e.terminal;
      x->stdin_closed = e.stdin_closed;
      x->restored = true;
      x->pid = e.pid;
      x->proc = e.proc;
      ExecProc* xp = x.get();
      procs.emplace(k, std::move(x));
      switch (e.state) {
        case ExecState::added: break;
        case ExecState::starting:
          log("warning: task {}: {}: the shim before this one died while starting it (its Start failed); "
              "stopped with 125",
              cfg.id, what);
          xp->stop(125, now_ns());
          break;
        case ExecState::stopped: xp->stop(e.exit_status, e.exited_at_ns); break;
        case ExecState::running:
          xp->phase = Phase::running;
          if (!xp->stdin_path.empty() && !xp->stdin_closed) xp->hold_stdin();  // the monitor holds the read end
          to_wait.emplace_back(k, e.proc);
          break;
        case ExecState::deleted: break;
      }
    }
    note_execs("journal:restore");  // as taken over (a `starting` one now stopped, with its time)
    for (const auto& [k, proc] : to_wait) {
      ExecProc* xp = find_proc(k);
      auto cs = cli::ControlSession::open(host::control_path(rec.state_dir, rec.vm), cli::control::Wait{proc}, {});
      boost::system::error_code ec;
      if (cs) {
        Fd sock = cs->take();
        xp->sock.assign(asio::local::stream_protocol(), sock.get(), ec);
        if (!ec) sock.release();
      }
      if (!cs || ec) {
        exec_ended(*xp, 137, fmt::format("its end cannot be waited for: {}", cs ? ec.message() : cs.error().message));
        continue;
      }
      read_exec(k);
    }
    return out;
  }

  /// on_exit() once the monitor's pidfd `fd` (owned from here on) is readable: it ended.
  void watch_exit(int fd) {
    exit_watch.emplace(io, fd);
    exit_watch->async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
      if (!ec) on_exit();
    });
  }

  /// The VM's monitor runs: `neshost run` (our child), or the replacement that adopted the VM.
  bool monitor_alive() const {
    return adopted ? host::is_alive(*adopted) : same_process_alive(rec.pid, rec.pid_start);
  }

  void on_exit() {
    kill_timer.cancel();
    std::uint32_t status = 125;  // a replacement is not our child: its status is the record's
    if (!adopted) {
      int st = 0;
      pid_t r;
      do r = ::waitpid(rec.pid, &st, 0);
      while (r < 0 && errno == EINTR);
      // neshost's own exit status is the workload's (docs/host.md); the record's is authoritative.
      status = WIFEXITED(st) ? static_cast<std::uint32_t>(WEXITSTATUS(st)) : static_cast<std::uint32_t>(128 + WTERMSIG(st));
    }
    // A pod's containers were the dead monitor's execs (their stdio its fds): a replacement could
    // not carry them on, so a pod's VM ends with its monitor (the kubelet restarts the pod).
    if (pod) kill_vmm(rec);
    else if (readopt()) return;
    std::int64_t at = now_ns();
    apply_recorded_exit(rec, status, at);
    finish(status, at);
  }

  /// The monitor died with its VM still running (its VMM outlives it, no outcome recorded): a
  /// replacement monitor takes the VM over (host/monitor/adopt.hpp; blocks the loop at most 15
  /// s) and the task goes on until that one ends, its record the task's exit. Control requests
  /// (Kill, Exec, ResizePty, Pids) reach it through the same control socket path. Output after
  /// the replacement goes to the VM's workload.log, not containerd's FIFOs (they were the dead
  /// monitor's stdio). false: nothing to adopt (the VM ended, or is gone with its monitor).
  bool readopt() {
    std::string said;
    auto st = cli::ensure_monitor(rec.state_dir, rec.vm, cfg.neshost, 15s, &said);
    if (!st || !*st || (*st)->status != host::VmStatus::running || !(*st)->monitor_alive || !(*st)->monitor)
      return false;
    const host::ProcessIdentity id = (*st)->monitor->monitor;
    if (adopted && *adopted == id) return false;
    Fd p{static_cast<int>(::syscall(SYS_pidfd_open, id.pid, 0))};
    if (!p || !host::is_alive(id)) return false;
    adopted = id;
    log("task {}: {}", cfg.id,
               said.empty() ? fmt::format("served by monitor pid {}", id.pid) : said);
    watch_exit(p.release());
    return true;
  }

  /// The task ended with `status` at `at_ns`: its exit published, its waiters answered.
  void finish(std::uint32_t status, std::int64_t at_ns) {
    task.stop(status, at_ns);
    task.report_exit(events, cfg.id);
  }

  ttrpc::Reply kill(const std::string& p) {
    auto req = parse<v2::KillRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "KillRequest: malformed");
    ExecProc* x = nullptr;
    if (auto c = check_exec(req->id(), req->exec_id(), &x); !c.status.ok()) return c;
    if (req->signal() < 1 || req->signal() > 64) return fail(ttrpc::Code::invalid_argument, fmt::format("signal: {} is not 1..64", req->signal()));
    if (process(x).phase == Phase::stopped) return fail(ttrpc::Code::not_found, "process already finished");
    // `all` (runc's `kill --all`: every process of the task): its execs are signalled too, each
    // through its own process group, before the task's own.
    if (req->all() && req->exec_id().empty())
      for (auto& [k, e] : procs)
        if (k.first == req->id() && e->exec && (e->phase == Phase::running || e->start_respond))
          (void)exec_kill(*e, req->signal());
    if (x && !x->exec && x->phase == Phase::created && !x->start_respond) {  // a pod's container never started
      x->stop(128 + req->signal(), now_ns());
      x->report_exit(events, x->task);
      return empty();
    }
    if (x) return exec_kill(*x, req->signal());
    if (task.phase == Phase::created) {
      // Never started: nothing runs; the task ends as if the signal had killed it.
      finish(128 + req->signal(), now_ns());
      return empty();
    }
    if (!monitor_alive())  // exited, its exit not yet seen here
      return fail(ttrpc::Code::not_found, "process already finished");
    host::Status reply = cli::control_call(host::control_path(rec.state_dir, rec.vm),
                                           cli::control::Kill{static_cast<int>(req->signal()), std::nullopt}, 2s);
    if (req->signal() == SIGKILL) {
      // SIGKILL must end the task whatever the guest does: if the VM has not exited 10 s after
      // the guest was told (or at once when it cannot be told), its whole session is killed
      // (exit 137: 128+SIGKILL).
      if (!reply) {
        kill_session();
        return empty();
      }
      kill_timer.expires_after(10s);
      kill_timer.async_wait([this](boost::system::error_code e) { if (!e) kill_session(); });
      return empty();
    }
    if (reply) return empty();
    // No control socket yet (the VM is still booting): SIGTERM still ends the task, as an
    // ordered shutdown of the VM (exit 143).
    if (req->signal() == SIGTERM) {
      if (!restored || same_process_alive(rec.pid, rec.pid_start)) ::kill(rec.pid, SIGTERM);
      return empty();
    }
    // Another signal waits for the guest (kill_async), as Pause does.
    if (not_ready_yet(reply.error())) return fail(ttrpc::Code::unavailable, kNotReadyYet);
    return fail(ttrpc::Code::unavailable,
                fmt::format("kill {}: {}", req->signal(), reply.error().message));
  }
  /// kill()'s answer for a signal the guest cannot take yet (it boots): kill_async delivers it.
  static constexpr const char* kNotReadyYet = "kill: the guest is not ready yet";

  /// Kill: kill(); a signal (other than SIGKILL and SIGTERM, which end a booting VM at once) to
  /// the task of a VM that still boots is delivered once its guest runs, waiting at most
  /// kControlWait (deliver_when_ready), and answered then.
  void kill_async(ttrpc::Call&& c, ttrpc::Respond respond) {
    ttrpc::Reply r = kill(c.payload);
    if (r.status.code != ttrpc::Code::unavailable || r.status.message != kNotReadyYet) return respond(std::move(r));
    auto req = parse<v2::KillRequest>(c.payload);
    const std::uint32_t sig = req->signal();
    deliver_when_ready(io, host::control_path(rec.state_dir, rec.vm), cli::control::Kill{static_cast<int>(sig), std::nullopt},
                       kControlWait, [this] { return task.phase == Phase::running && monitor_alive(); },
                       [sig, respond = std::move(respond)](host::Status st) {
                         if (st) return respond(empty());
                         respond(fail(ttrpc::Code::unavailable, fmt::format("kill {}: {}", sig, st.error().message)));
                       });
  }

  ttrpc::Reply state(const std::string& p) {
    auto req = parse<v2::StateRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "StateRequest: malformed");
    ExecProc* x = nullptr;
    if (auto c = check_exec(req->id(), req->exec_id(), &x); !c.status.ok()) {
      // A deleted exec answers from its receipt (STOPPED, its status and time), so a retried
      // DeleteProcess, which containerd sends after a State, gets the receipt, identical.
      auto it = req->exec_id().empty() ? receipts.end() : receipts.find({req->id(), req->exec_id()});
      if (it == receipts.end()) return c;
      v2::StateResponse st;
      st.set_id(req->exec_id());
      st.set_exec_id(req->exec_id());
      st.set_bundle(cfg.bundle.string());
      st.set_pid(it->second.pid());
      st.set_status(containerd::v1::types::Status::STOPPED);
      st.set_exit_status(it->second.exit_status());
      *st.mutable_exited_at() = it->second.exited_at();
      return ok(st);
    }
    auto st = process(x).state(bundle_of(x).string());
    if (!x && task.phase == Phase::running && vm_paused()) st.set_status(containerd::v1::types::Status::PAUSED);
    return ok(st);
  }

  /// Whether the task's VM is paused: its monitor's marker of the current generation (the one
  /// record ps and a replacement monitor read; a SIGKILL that resumed it cleared it).
  bool vm_paused() const {
    auto st = host::reconcile(rec.state_dir, rec.vm);
    return st && *st && (*st)->status == host::VmStatus::running && (*st)->paused;
  }

  /// Pause / Resume (`resume`): the task's VM's vCPUs, through its monitor (QMP stop/cont). A pod's
  /// container shares the pod's VM: only the sandbox task pauses it. Publishes /tasks/paused or
  /// /tasks/resumed, as runc's shim. One that comes while the VM boots (containerd reports the task
  /// RUNNING once Start answered) waits for its guest, at most kControlWait (deliver.hpp).
  void pause_resume(const std::string& id, bool resume, ttrpc::Respond respond) {
    const char* what = resume ? "resume" : "pause";
    ExecProc* x = nullptr;
    if (auto c = check_exec(id, "", &x); !c.status.ok()) return respond(std::move(c));
    if (x)
      return respond(fail(ttrpc::Code::failed_precondition,
                          fmt::format("{}: container {} runs in its pod's VM: {} the pod's sandbox task (every "
                                      "container of the pod with it)", what, id, what)));
    if (task.phase != Phase::running || !monitor_alive())
      return respond(fail(ttrpc::Code::failed_precondition, fmt::format("{}: task {} is not running", what, id)));
    if (vm_paused() != resume)
      return respond(fail(ttrpc::Code::failed_precondition,
                          fmt::format("{}: task {} is {}paused", what, id, resume ? "not " : "already ")));
    deliver_when_ready(io, host::control_path(rec.state_dir, rec.vm),
                       resume ? cli::control::Request{cli::control::Resume{}} : cli::control::Request{cli::control::Pause{}},
                       kControlWait, [this] { return task.phase == Phase::running; },
                       [this, id, resume, what, respond = std::move(respond)](host::Status r) {
                         if (!r) return respond(fail(ttrpc::Code::unknown, fmt::format("{} {}: {}", what, id, r.error().message)));
                         if (resume) {
                           containerd::events::TaskResumed e;
                           e.set_container_id(id);
                           events.publish("/tasks/resumed", e);
                         } else {
                           containerd::events::TaskPaused e;
                           e.set_container_id(id);
                           events.publish("/tasks/paused", e);
                         }
                         respond(empty());
                       });
  }
  /// How long a control (Pause, Resume, Kill with a signal other than SIGKILL and SIGTERM) that
  /// comes while the VM boots waits for its guest: an exec's Start waits as long for the monitor.
  static constexpr std::chrono::milliseconds kControlWait{30000};
  /// Update: a microVM's memory and vCPUs are fixed when it boots and the guest applies no cgroup
  /// limits of its own, so nothing can be changed live: an Update that asks for anything answers
  /// FAILED_PRECONDITION naming each resource it asked for (the LinuxResources JSON containerd
  /// sends: `memory.limit`, `cpu.quota`, ...; an annotation by its key). One that asks for nothing
  /// is OK.
  ttrpc::Reply update(const std::string& p) {
    auto req = parse<v2::UpdateTaskRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "UpdateTaskRequest: malformed");
    ExecProc* x = nullptr;
    if (auto c = check_exec(req->id(), "", &x); !c.status.ok()) return c;
    std::vector<std::string> asked;
    if (req->has_resources() && !req->resources().value().empty()) {
      simdjson::dom::parser jp;
      simdjson::dom::object o;
      if (jp.parse(simdjson::padded_string(req->resources().value())).get(o)) {
        asked.push_back(fmt::format("resources of type {}", req->resources().type_url()));
      } else {
        for (auto [k, v] : o) {
          if (v.is_null()) continue;
          simdjson::dom::object sub;
          if (v.get(sub) == simdjson::SUCCESS) {
            for (auto [k2, v2] : sub)
              if (!v2.is_null()) asked.push_back(fmt::format("{}.{}", std::string_view(k), std::string_view(k2)));
          } else {
            asked.push_back(std::string(k));
          }
          if (asked.size() >= 16) break;  // bounded: the message names the first ones
        }
      }
    }
    for (const auto& [k, v] : req->annotations()) {
      if (asked.size() >= 16) break;
      asked.push_back("annotation " + k.substr(0, 128));
    }
    if (asked.empty()) return empty();
    std::string list;
    for (const auto& a : asked) list += (list.empty() ? "" : ", ") + a;
    return fail(ttrpc::Code::failed_precondition,
                fmt::format("Update: cannot change {} of task {} live: a microVM's memory and vCPUs are fixed when it "
                            "boots and the guest applies no cgroup limits of its own (recreate the task)",
                            list, req->id()));
  }

  void pause(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::PauseRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "PauseRequest: malformed"));
    pause_resume(req->id(), false, std::move(respond));
  }
  void resume(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::ResumeRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "ResumeRequest: malformed"));
    pause_resume(req->id(), true, std::move(respond));
  }

  ttrpc::Reply del(const std::string& p) {
    auto req = parse<v2::DeleteRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "DeleteRequest: malformed");
    // A retried Delete gets the first one's answer (a receipt), not NOT_FOUND.
    if (req->id() == cfg.id && req->exec_id().empty() && task.phase == Phase::deleted) return ok(task.delete_response());
    if (auto it = receipts.find({req->id(), req->exec_id()}); it != receipts.end()) return ok(it->second);
    ExecProc* x = nullptr;
    if (auto c = check_exec(req->id(), req->exec_id(), &x); !c.status.ok()) return c;
    const Process& pr = process(x);
    if (pr.phase == Phase::running)
      return fail(ttrpc::Code::failed_precondition, fmt::format("{}: still running", x ? name(*x) : "task " + pr.id));
    if (x && x->start_respond) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: starting", name(*x)));
    v2::DeleteResponse r = pr.delete_response();
    if (x && !x->exec) {
      auto d = delete_container(*x);
      if (!d) return fail(ttrpc::Code::internal, d.error().message);
      keep_receipt({req->id(), {}}, *d);
      return ok(*d);
    }
    if (x) {
      // The receipt journaled before the answer; not durable: the exec stays as it was (stopped,
      // not deleted) and the Delete fails naming the journal.
      const Key k = key(*x);
      auto held = std::move(procs.at(k));
      procs.erase(k);
      keep_receipt(k, r);
      if (auto w = persist_execs("journal:exec-delete"); !w) {
        forget_receipt(k);
        procs.emplace(k, std::move(held));
        return fail(ttrpc::Code::internal, fmt::format("exec {}: delete: journal: {}", k.second, w.error().message));
      }
      boost::system::error_code ig;
      held->sock.close(ig);
      return ok(r);
    }
    // The receipt first: whatever asks after this (a retry, `shim delete`) gets the same answer.
    // Not durable: nothing is removed or told, the task stays stopped, the Delete fails.
    if (auto w = write_receipt("receipt:delete", cfg.bundle, r); !w)
      return fail(ttrpc::Code::internal, fmt::format("task {}: delete: receipt: {}", cfg.id, w.error().message));
    fault_point("delete:receipt");
    remove_task(cfg.bundle, rec);
    task.phase = Phase::deleted;
    // A Wait sent before a Start that failed is answered now (the task is gone).
    for (auto& r : std::exchange(task.waiters, {})) r(fail(ttrpc::Code::not_found, fmt::format("task {}: deleted", cfg.id)));
    ev::TaskDelete e;
    e.set_container_id(cfg.id);
    e.set_pid(r.pid());
    e.set_exit_status(r.exit_status());
    *e.mutable_exited_at() = r.exited_at();
    events.publish("/tasks/delete", e);
    return ok(r);
  }

  // The guest's processes (pids as the guest sees them, 1 = nesinit), asked of `neshost run`
  // through its control socket on a thread of its own, so the shim's loop never waits for a
  // guest. A guest that cannot answer (not booted yet, an older init) gives the VM's monitor
  // process instead, as before.
  void pids(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::PidsRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "PidsRequest: malformed"));
    if (req->id() != cfg.id) {  // a pod's container: its own process (its pid in the guest)
      ExecProc* c = nullptr;
      if (auto r = check_exec(req->id(), {}, &c); !r.status.ok()) return respond(std::move(r));
      v2::PidsResponse r;
      if (c->phase == Phase::running) r.add_processes()->set_pid(c->pid);
      return respond(ok(r));
    }
    if (auto r = check_id(req->id(), {}); !r.status.ok()) return respond(std::move(r));
    if (task.phase != Phase::running) return respond(ok(v2::PidsResponse{}));
    const auto path = host::control_path(rec.state_dir, rec.vm);
    const std::uint32_t monitor = static_cast<std::uint32_t>(rec.pid);
    askers.emplace_back([this, path, monitor, respond = std::move(respond)]() mutable {
      auto list = cli::guest_processes(path);
      asio::post(io, [this, id = std::this_thread::get_id(), list = std::move(list), monitor,
                      respond = std::move(respond)]() {
        // The asking thread is done but for returning: joined here, on the loop.
        for (auto it = askers.begin(); it != askers.end(); ++it)
          if (it->get_id() == id) {
            it->join();
            askers.erase(it);
            break;
          }
        v2::PidsResponse r;
        if (list) {
          for (const auto& pi : list->processes) r.add_processes()->set_pid(static_cast<std::uint32_t>(pi.pid));
        } else {
          r.add_processes()->set_pid(monitor);
        }
        respond(ok(r));
      });
    });
  }

  /// Stats: containerd's `io.containerd.cgroups.v2.Metrics`, filled with the guest's own figures
  /// (its init's totals beside the process list, docs/protocol.md "Process list"): pids.current
  /// its user-space processes, cpu usage/user/system µs since boot over all vCPUs, memory usage
  /// (MemTotal - MemAvailable) and usage_limit (MemTotal). What the workload uses, as runc's
  /// cgroup would say; what the VMM costs the host is `neshost stats`'. A paused or stopped task:
  /// FAILED_PRECONDITION (its guest cannot answer). A pod's container: the pod VM's figures.
  void stats(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::StatsRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "StatsRequest: malformed"));
    ExecProc* x = nullptr;
    if (auto r = check_exec(req->id(), "", &x); !r.status.ok()) return respond(std::move(r));
    if (task.phase != Phase::running || !monitor_alive() || (x && x->phase != Phase::running))
      return respond(fail(ttrpc::Code::failed_precondition, fmt::format("stats: task {} is not running", req->id())));
    if (vm_paused())
      return respond(fail(ttrpc::Code::failed_precondition,
                          fmt::format("stats: task {} is paused: its guest cannot answer", req->id())));
    const auto path = host::control_path(rec.state_dir, rec.vm);
    askers.emplace_back([this, path, respond = std::move(respond)]() mutable {
      auto list = cli::guest_processes(path);
      asio::post(io, [this, id = std::this_thread::get_id(), list = std::move(list), respond = std::move(respond)]() {
        for (auto it = askers.begin(); it != askers.end(); ++it)
          if (it->get_id() == id) {
            it->join();
            askers.erase(it);
            break;
          }
        if (!list) return respond(fail(ttrpc::Code::unavailable, fmt::format("stats: {}", list.error().message)));
        ::io::containerd::cgroups::v2::Metrics m;
        m.mutable_pids()->set_current(list->processes.size() + list->truncated);
        if (const auto& t = list->totals) {
          auto* cpu = m.mutable_cpu();
          cpu->set_user_usec(t->cpu_user_usec);
          cpu->set_system_usec(t->cpu_system_usec);
          cpu->set_usage_usec(t->cpu_user_usec + t->cpu_system_usec);
          auto* mem = m.mutable_memory();
          mem->set_usage(t->mem_total > t->mem_available ? t->mem_total - t->mem_available : 0);
          mem->set_usage_limit(t->mem_total);
        }
        v2::StatsResponse r;
        r.mutable_stats()->set_type_url("io.containerd.cgroups.v2.Metrics");
        r.mutable_stats()->set_value(m.SerializeAsString());
        respond(ok(r));
      });
    });
  }

  ttrpc::Reply connect(const std::string& p) {
    auto req = parse<v2::ConnectRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ConnectRequest: malformed");
    v2::ConnectResponse r;
    r.set_shim_pid(static_cast<std::uint32_t>(::getpid()));
    r.set_task_pid(task.state(cfg.bundle.string()).pid());  // as State says it (the shim's before Start)
    r.set_version(NESINIT_SHIM_VERSION);
    return ok(r);
  }

  ttrpc::Reply resize(const std::string& p) {
    auto req = parse<v2::ResizePtyRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ResizePtyRequest: malformed");
    ExecProc* x = nullptr;
    if (auto c = check_exec(req->id(), req->exec_id(), &x); !c.status.ok()) return c;
    if (req->width() < 1 || req->height() < 1 || req->width() > 0xffff || req->height() > 0xffff)
      return fail(ttrpc::Code::invalid_argument, fmt::format("width {} height {}: each must be 1..65535", req->width(), req->height()));
    if (x) {
      if (!x->terminal) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: no terminal", name(*x)));
      if (x->phase == Phase::stopped) return fail(ttrpc::Code::not_found, "process already finished");
      if (x->proc == 0) {  // before it started: the size it starts with
        x->pending_resize = std::pair{req->height(), req->width()};
        return empty();
      }
      auto done = cli::control_call(host::control_path(rec.state_dir, rec.vm),
                                    cli::control::Resize{static_cast<std::uint16_t>(req->height()),
                                                         static_cast<std::uint16_t>(req->width()), x->proc},
                                    2s);
      if (done) return empty();
      return fail(ttrpc::Code::unavailable, fmt::format("resize: {}", done.error().message));
    }
    if (task.phase != Phase::running) return fail(ttrpc::Code::failed_precondition, "task is not running");
    if (!spec.terminal) return fail(ttrpc::Code::failed_precondition, "the task has no terminal");
    // ctr resizes right after Start, before `neshost run` has its control socket: the latest size
    // is kept and delivered as soon as the socket answers (neshost makes it the size the workload
    // starts with when the guest has not booted yet).
    pending_resize = cli::control::Resize{static_cast<std::uint16_t>(req->height()),
                                          static_cast<std::uint16_t>(req->width()), std::nullopt};
    resize_deadline = std::chrono::steady_clock::now() + 30s;
    deliver_resize();
    return empty();
  }

  void deliver_resize() {
    if (!pending_resize || task.phase != Phase::running) return;
    auto path = host::control_path(rec.state_dir, rec.vm);
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      auto reply = cli::control_request(path, *pending_resize, 2s);
      if (reply) {  // "ok", or neshost's final word on it
        if (!std::holds_alternative<cli::control::Ok>(*reply))
          log("{}: {}", cfg.id, cli::control::encode(*reply));
        pending_resize.reset();
        return;
      }
    }
    if (std::chrono::steady_clock::now() > resize_deadline) {
      log("{}: {} not delivered in 30 s", cfg.id,
                 cli::control::encode(cli::control::Request{*pending_resize}));
      pending_resize.reset();
      return;
    }
    resize_timer.expires_after(20ms);
    resize_timer.async_wait([this](boost::system::error_code e) { if (!e) deliver_resize(); });
  }

  ttrpc::Reply close_io(const std::string& p) {
    auto req = parse<v2::CloseIORequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "CloseIORequest: malformed");
    // The stdin FIFO's reader is `neshost run`: once the shim's writer is closed too, the last
    // client's close is the EOF the workload sees (ctr sends CloseIO when its stdin ends).
    ExecProc* x = nullptr;
    auto c = check_exec(req->id(), req->exec_id(), &x);
    if (c.status.ok() && req->stdin()) {
      // Recorded first (an exec's in the journal, the task's in its record: a replacement then
      // holds no writer again and tells the monitor again); not durable: nothing is closed and
      // CloseIO fails naming the file, so a retry does it all.
      if (x && !x->stdin_closed) {
        x->stdin_closed = true;
        if (auto w = persist_execs("journal:close-io"); !w) {
          x->stdin_closed = false;
          return fail(ttrpc::Code::internal, fmt::format("{}: CloseIO: journal: {}", name(*x), w.error().message));
        }
      }
      // The task's monitor holds a writer too (--stdin-hold): told to let go.
      const bool tell_monitor = !x && !task.stdin_path.empty() && task.phase == Phase::running && !close_stdin_deadline;
      if (tell_monitor && !rec.stdin_closed) {
        rec.stdin_closed = true;
        if (auto w = persist("record:close-io"); !w) {
          rec.stdin_closed = false;
          return fail(ttrpc::Code::internal, fmt::format("task {}: CloseIO: record: {}", cfg.id, w.error().message));
        }
      }
      process(x).stdin_hold.reset();
      if (tell_monitor) {
        close_stdin_deadline = std::chrono::steady_clock::now() + 60s;
        deliver_close_stdin();
      }
    }
    return c;
  }

  /// `close-stdin` to the task's monitor (CloseIO), tried again every 20 ms while its control
  /// socket does not exist yet, for up to 60 s (then said in the log: the workload's stdin stays
  /// open until the VM ends).
  std::optional<std::chrono::steady_clock::time_point> close_stdin_deadline;
  asio::steady_timer close_stdin_timer{io};
  void deliver_close_stdin() {
    if (task.phase != Phase::running) return;
    auto path = host::control_path(rec.state_dir, rec.vm);
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      auto reply = cli::control_request(path, cli::control::CloseStdin{}, 2s);
      if (reply) {
        if (!std::holds_alternative<cli::control::Ok>(*reply))
          log("{}: close-stdin: {}", cfg.id, cli::control::encode(*reply));
        return;
      }
    }
    if (std::chrono::steady_clock::now() > *close_stdin_deadline) {
      log("{}: close-stdin not delivered in 60 s", cfg.id);
      return;
    }
    close_stdin_timer.expires_after(20ms);
    close_stdin_timer.async_wait([this](boost::system::error_code e) { if (!e) deliver_close_stdin(); });
  }

  ttrpc::Reply shutdown(const std::string& p) {
    auto req = parse<v2::ShutdownRequest>(p);
    if (!req) return fail(ttrpc::Code::invalid_argument, "ShutdownRequest: malformed");
    // A task not yet deleted keeps its shim (containerd's own shims exit only with no task left).
    if (task.phase != Phase::none && task.phase != Phase::deleted) return empty();
    for (const auto& [k, x] : procs)
      if (!x->exec) return empty();  // a pod's container not yet deleted
    asio::post(io, [this] { if (cfg.shutdown) cfg.shutdown(); });
    return empty();
  }

  void wait(ttrpc::Call&& c, ttrpc::Respond respond) {
    auto req = parse<v2::WaitRequest>(c.payload);
    if (!req) return respond(fail(ttrpc::Code::invalid_argument, "WaitRequest: malformed"));
    // A task stopped or deleted still answers (deleted: with its last exit).
    if (req->id() == cfg.id && req->exec_id().empty() && (task.phase == Phase::stopped || task.phase == Phase::deleted))
      return respond(ok(task.wait_response()));
    ExecProc* x = nullptr;
    if (auto r = check_exec(req->id(), req->exec_id(), &x); !r.status.ok()) return respond(std::move(r));
    Process& pr = process(x);
    if (pr.phase == Phase::stopped) return respond(ok(pr.wait_response()));
    pr.waiters.push_back(std::move(respond));
  }
};

TaskService::TaskService(asio::io_context& io, ServiceConfig cfg, Publisher& events)
    : impl_(std::make_unique<Impl>(io, std::move(cfg), events)) {}
TaskService::~TaskService() = default;

std::optional<std::string> TaskService::restore() { return impl_->restore(); }

void TaskService::register_on(ttrpc::Server& server) {
  Impl* im = impl_.get();
  auto sync = [&](const char* name, Impl::Handler h) {
    server.add(std::string(kService), name, [im, h](ttrpc::Call&& c, ttrpc::Respond r) { r((im->*h)(c.payload)); });
  };
  sync("Create", &Impl::create);
  server.add(std::string(kService), "Start", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->start_any(std::move(c), std::move(r)); });
  sync("Exec", &Impl::exec_add);
  sync("State", &Impl::state);
  server.add(std::string(kService), "Kill", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->kill_async(std::move(c), std::move(r)); });
  sync("Delete", &Impl::del);
  server.add(std::string(kService), "Pids", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->pids(std::move(c), std::move(r)); });
  server.add(std::string(kService), "Stats", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->stats(std::move(c), std::move(r)); });
  sync("Connect", &Impl::connect);
  sync("ResizePty", &Impl::resize);
  sync("CloseIO", &Impl::close_io);
  sync("Shutdown", &Impl::shutdown);
  server.add(std::string(kService), "Pause", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->pause(std::move(c), std::move(r)); });
  server.add(std::string(kService), "Resume", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->resume(std::move(c), std::move(r)); });
  sync("Update", &Impl::update);
  server.add(std::string(kService), "Wait", [im](ttrpc::Call&& c, ttrpc::Respond r) { im->wait(std::move(c), std::move(r)); });
  // Known, and answered clearly: containerd maps UNIMPLEMENTED to ErrNotImplemented.
  for (const char* m : {"Checkpoint"}) {
    std::string why = fmt::format("{}: not supported by the nesinit shim", m);
    server.add(std::string(kService), m, [why](ttrpc::Call&&, ttrpc::Respond r) {
      r(ttrpc::Reply{{ttrpc::Code::unimplemented, why}, {}});
    });
  }
}

}  // namespace nes::shim
