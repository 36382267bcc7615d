#include "host/monitor/reconcile.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fmt/format.h>
#include <simdjson.h>
#include <thread>

#include "host/lib/base.hpp"
#include "base/small_file.hpp"
#include "host/monitor/removal.hpp"
#include "host/monitor/vmm_record.hpp"
#include "protocol/status.hpp"

namespace nes::host {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kSmallFileCap = 64 * 1024;  // /proc/PID/stat
/// 128+SIGTERM: what docker reports for a container `docker stop` ended (POSIX shell convention).
constexpr int kStoppedStatus = proto::kStatusSignalBase + 15;

std::string errno_text(int e) { return std::strerror(e); }

std::optional<std::string> boot_id() {
  auto s = base::read_small_file("/proc/sys/kernel/random/boot_id", 256);
  if (!s) return std::nullopt;
  std::string id = *s;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

/// Fields 3 (state) and 22 (starttime) of /proc/PID/stat. The command name (field 2) may hold
/// spaces and parentheses: parse from the last ')'.
std::optional<std::pair<char, unsigned long long>> stat_of(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto s = base::read_small_file(fmt::format("/proc/{}/stat", pid).c_str(), kSmallFileCap);
  if (!s) return std::nullopt;
  auto rp = s->rfind(')');
  if (rp == std::string::npos || rp + 2 >= s->size()) return std::nullopt;
  std::string_view rest = std::string_view(*s).substr(rp + 2);
  char state = rest.empty() ? '?' : rest[0];
  // rest starts at field 3; field 22 is 19 spaces further on.
  std::size_t pos = 0;
  for (int f = 3; f < 22; ++f) {
    pos = rest.find(' ', pos);
    if (pos == std::string_view::npos) return std::nullopt;
    ++pos;
  }
  unsigned long long start = 0;
  auto end = rest.find(' ', pos);
  auto field = rest.substr(pos, end == std::string_view::npos ? rest.size() - pos : end - pos);
  auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), start);
  if (ec != std::errc() || p != field.data() + field.size()) return std::nullopt;
  return std::pair{state, start};
}

}  // namespace

namespace {

/// The per-VM lock (host/lib/state_dir.hpp lock_vm(), the one write_record() takes) of the VM
/// directory `dir`. Bounded: 500 tries 10 ms apart.
Result<Fd> lock_vm(const fs::path& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!d) return Error{fmt::format("open {}: {}", dir.string(), errno_text(errno))};
  return host::lock_vm(d.get(), dir, 500);
}

/// A parsed file, or why not: absent (nullopt value, no error) / unreadable or invalid (error).
template <class T>
struct Loaded {
  std::optional<T> value;
  std::optional<std::string> error;
};

template <class T, class Parse>
Loaded<T> load(const fs::path& p, Parse parse) {
  auto text = base::read_small_file(p.c_str(), 1u << 20);
  if (!text && text.error().err == ENOENT) return {};
  if (!text) return {std::nullopt, text.error().message};
  auto v = parse(*text);
  if (!v) return {std::nullopt, fmt::format("{}: {}", p.filename().string(), v.error().message)};
  return {std::move(*v), std::nullopt};
}

struct StopRequest {
  std::uint64_t generation = 0;
  WallTime requested_at{};
  std::string reason;  // the monitor's own cause (empty: a user's request)
};

std::string encode_stop(std::string_view vm, const StopRequest& s) {
  return fmt::format(R"({{"schema_version":1,"vm":{},"generation":{},"requested_at":"{}"{}}})"
                     "\n",
                     json_string(vm), s.generation, format_rfc3339(s.requested_at),
                     s.reason.empty() ? std::string() : R"(,"reason":)" + json_string(s.reason));
}

Result<StopRequest> parse_stop(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object obj;
  if (parser.parse(padded).get(obj)) return Error{"not a JSON object"};
  StopRequest s;
  std::uint64_t gen = 0;
  if (obj["generation"].get_uint64().get(gen)) return Error{"generation: expected an unsigned integer"};
  s.generation = gen;
  std::string_view at;
  if (!obj["requested_at"].get_string().get(at))
    if (auto t = parse_rfc3339(at)) s.requested_at = *t;
  std::string_view why;
  if (!obj["reason"].get_string().get(why)) s.reason = std::string(why.substr(0, 1024));
  return s;
}

Loaded<MonitorInfo> load_monitor(const fs::path& state, std::string_view vm) {
  return load<MonitorInfo>(monitor_path(state, vm), [](std::string_view t) { return parse_monitor(t); });
}
Loaded<Record> load_record(const fs::path& state, std::string_view vm) {
  return load<Record>(record_path(state, vm), [](std::string_view t) { return parse_record(t); });
}
Loaded<StopRequest> load_stop(const fs::path& state, std::string_view vm) {
  return load<StopRequest>(stop_path(state, vm), [](std::string_view t) { return parse_stop(t); });
}

/// The VMM of `generation` recorded in vmm.json, if any (an unreadable file: none).
std::optional<ProcessIdentity> vmm_of(const fs::path& state, std::string_view vm, std::uint64_t generation) {
  auto v = load_vmm(state, vm);
  if (!v || !*v || (*v)->generation != generation || !(*v)->vmm) return std::nullopt;
  return (*v)->vmm;
}

bool is_natural(proto::Outcome o) {
  return o == proto::Outcome::exited || o == proto::Outcome::signalled;
}

std::string describe(const Record& r) {
  std::string s;
  if (r.outcome == proto::Outcome::exited && r.exit_code) s = fmt::format("exited with code {}", *r.exit_code);
  else if (r.outcome == proto::Outcome::signalled && r.signal) s = fmt::format("killed by signal {}", *r.signal);
  else s = r.reason.empty() ? std::string(proto::to_string(r.outcome))
                            : fmt::format("{}: {}", proto::to_string(r.outcome), r.reason);
  // Output lost overrides the status (reported_status); the reason says so.
  for (const auto& l : describe_loss(r)) s += "; " + l;
  return s;
}

}  // namespace

// ---- process identity ----

std::optional<ProcessIdentity> identity_of(pid_t pid) {
  auto st = stat_of(pid);
  auto b = boot_id();
  if (!st || !b) return std::nullopt;
  return ProcessIdentity{pid, st->second, *b};
}

std::optional<ProcessIdentity> self_identity() { return identity_of(::getpid()); }

Fd pin_process(const ProcessIdentity& id) {
  Fd fd{static_cast<int>(::syscall(SYS_pidfd_open, id.pid, 0))};
  if (fd && !is_alive(id)) fd.reset();
  return fd;
}

bool is_alive(const ProcessIdentity& id) {
  auto st = stat_of(id.pid);
  if (!st || st->second != id.start_time) return false;
  if (st->first == 'Z' || st->first == 'X') return false;
  auto b = boot_id();
  return b && *b == id.boot_id;
}

// ---- monitor.json ----

std::string encode_monitor(const MonitorInfo& m) {
  std::string cmd = "[";
  for (std::size_t i = 0; i < m.command.size(); ++i) {
    if (i) cmd += ',';
    cmd += json_string(m.command[i]);
  }
  cmd += "]";
  std::string ports;
  if (!m.ports.empty()) {
    ports = ",\"ports\":[";
    for (std::size_t i = 0; i < m.ports.size(); ++i) ports += (i ? "," : "") + json_string(m.ports[i]);
    ports += "]";
  }
  return fmt::format(
      R"({{"schema_version":{},"vm":{},"generation":{},"pid":{},"start_time":{},"boot_id":{},)"
      R"("created_at":"{}","command":{}{}}})"
      "\n",
      MonitorInfo::kSchemaVersion, json_string(m.vm), m.generation, m.monitor.pid,
      m.monitor.start_time, json_string(m.monitor.boot_id), format_rfc3339(m.created_at), cmd, ports);
}

Result<MonitorInfo> parse_monitor(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root))
    return Error{fmt::format("not valid JSON ({})", simdjson::error_message(err))};
  simdjson::dom::object obj;
  if (root.get(obj)) return Error{"expected a JSON object"};
  MonitorInfo m;
  std::uint64_t u = 0;
  if (obj["schema_version"].get_uint64().get(u) || u != MonitorInfo::kSchemaVersion)
    return Error{fmt::format("schema_version: expected {}", MonitorInfo::kSchemaVersion)};
  std::string_view s;
  if (obj["vm"].get_string().get(s)) return Error{"vm: expected a string"};
  m.vm = std::string(s);
  if (obj["generation"].get_uint64().get(m.generation) || m.generation == 0)
    return Error{"generation: expected an integer >= 1"};
  if (obj["pid"].get_uint64().get(u) || u < 1 || u > 0x3fffffff) return Error{"pid: expected a pid"};
  m.monitor.pid = static_cast<pid_t>(u);
  if (obj["start_time"].get_uint64().get(u)) return Error{"start_time: expected an unsigned integer"};
  m.monitor.start_time = u;
  if (obj["boot_id"].get_string().get(s)) return Error{"boot_id: expected a string"};
  m.monitor.boot_id = std::string(s);
  if (obj["created_at"].get_string().get(s)) return Error{"created_at: expected an RFC 3339 string"};
  auto t = parse_rfc3339(s);
  if (!t) return Error{"created_at: expected YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ"};
  m.created_at = *t;
  simdjson::dom::array cmd;
  if (obj["command"].get_array().get(cmd)) return Error{"command: expected an array of strings"};
  for (auto e : cmd) {
    if (e.get_string().get(s)) return Error{"command: expected an array of strings"};
    m.command.emplace_back(s);
  }
  // Additive (absent: none).
  simdjson::dom::array ports;
  if (auto err = obj["ports"].get_array().get(ports); err != simdjson::NO_SUCH_FIELD) {
    if (err) return Error{"ports: expected an array of strings"};
    for (auto e : ports) {
      if (e.get_string().get(s)) return Error{"ports: expected an array of strings"};
      m.ports.emplace_back(s);
    }
  }
  return m;
}

// ---- writers (under the lock) ----

Result<std::uint64_t> begin_generation(const fs::path& state, MonitorInfo m,
                                       std::chrono::milliseconds settle) {
  if (auto id = check_vm_id(m.vm); !id) return id.error();
  fs::path dir = state / m.vm;
  if (auto prev = load_monitor(state, m.vm); prev.value && prev.value->monitor != m.monitor &&
                                             is_alive(prev.value->monitor)) {
    auto rec = load_record(state, m.vm);
    if (rec.value && rec.value->generation >= prev.value->generation) {
      // Its outcome is recorded; it is powering its VM off. The pidfd pins the process, and the
      // identity checked again after opening it rules out a recycled pid.
      Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, prev.value->monitor.pid, 0))};
      if (pidfd && is_alive(prev.value->monitor)) {
        pollfd pf{pidfd.get(), POLLIN, 0};
        auto deadline = std::chrono::steady_clock::now() + settle;
        for (;;) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          if (left.count() <= 0) break;
          int n = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
          if (n != 0 && !(n < 0 && errno == EINTR)) break;
        }
      }
    }
  }
  if (auto s = make_dirs_durable(dir); !s) return s.error();
  auto lock = lock_vm(dir);
  if (!lock) return lock.error();
  auto old = load_monitor(state, m.vm);
  if (old.value && is_alive(old.value->monitor) && old.value->monitor != m.monitor)
    return Error{fmt::format("VM '{}' is running in {} (monitor pid {}, generation {})", m.vm,
                             state.string(), old.value->monitor.pid, old.value->generation)};
  std::uint64_t gen = old.value ? old.value->generation : 0;
  auto last = load_record(state, m.vm);
  if (old.value && !(last.value && last.value->generation >= old.value->generation))
    if (auto v = vmm_of(state, m.vm, old.value->generation); v && is_alive(*v))
      return Error{fmt::format("VM '{}' is running in {} (its monitor is gone, its VMM pid {} of generation {} "
                               "runs; any neshost command on it starts a replacement monitor)",
                               m.vm, state.string(), v->pid, old.value->generation)};
  if (last.value) gen = std::max(gen, last.value->generation);
  m.generation = gen + 1;
  // Left by earlier generations: a stop request (generation-tagged, but it is history now) and
  // the control socket of a monitor that was killed.
  ::unlink(stop_path(state, m.vm).c_str());
  ::unlink(control_path(state, m.vm).c_str());
  if (auto s = write_durable(dir, kMonitorFile, encode_monitor(m)); !s) return s.error();
  return m.generation;
}

namespace {
/// An existing VM's directory and its lock (held while `lock` lives).
struct LockedVm {
  fs::path dir;
  Fd lock;
};
/// `vm`'s directory under `state` locked: the id checked, the directory there, lock_vm held.
Result<LockedVm> lock_existing_vm(const fs::path& state, std::string_view vm) {
  if (auto id = check_vm_id(vm); !id) return id.error();
  fs::path dir = state / std::string(vm);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{fmt::format("no VM '{}' in {}", vm, state.string())};
  auto lock = lock_vm(dir);
  if (!lock) return lock.error();
  return LockedVm{std::move(dir), std::move(*lock)};
}
}  // namespace

Result<MonitorInfo> take_over_generation(const fs::path& state, std::string_view vm, const ProcessIdentity& self) {
  auto locked = lock_existing_vm(state, vm);
  if (!locked) return locked.error();
  auto mon = load_monitor(state, vm);
  if (!mon.value) return Error{mon.error ? *mon.error : std::string("no monitor.json")};
  MonitorInfo m = *mon.value;
  if (m.monitor != self && is_alive(m.monitor))
    return Error{fmt::format("the monitor (pid {}) of generation {} is alive", m.monitor.pid, m.generation)};
  if (auto rec = load_record(state, vm); rec.value && rec.value->generation > m.generation)
    return Error{fmt::format("a newer generation ({}) is recorded", rec.value->generation)};
  auto v = vmm_of(state, vm, m.generation);
  if (!v) return Error{fmt::format("no VMM of generation {} is recorded", m.generation)};
  if (!is_alive(*v)) return Error{fmt::format("its VMM (pid {}) is gone", v->pid)};
  m.monitor = self;
  if (auto s = write_durable(locked->dir, kMonitorFile, encode_monitor(m)); !s) return s.error();
  return m;
}

Result<StopResult> persist_stop(const fs::path& state, std::string_view vm, std::uint64_t generation,
                                std::string_view reason) {
  auto locked = lock_existing_vm(state, vm);
  if (!locked) return locked.error();
  const fs::path& dir = locked->dir;
  if (auto rec = load_record(state, vm); rec.value && rec.value->generation == generation)
    return StopResult{StopResult::Kind::already_final, rec.value};
  if (auto st = load_stop(state, vm); st.value && st.value->generation == generation)
    return StopResult{StopResult::Kind::already_requested, std::nullopt};
  if (auto s = write_durable(dir, kStopFile, encode_stop(vm, {generation, wall_now(), std::string(reason)})); !s)
    return s.error();
  return StopResult{StopResult::Kind::persisted, std::nullopt};
}

// ---- reconcile ----

std::string_view to_string(VmStatus s) {
  switch (s) {
    case VmStatus::running: return "running";
    case VmStatus::exited: return "exited";
    case VmStatus::failed: return "failed";
    case VmStatus::stopped: return "stopped";
  }
  return "failed";
}

Result<std::optional<VmState>> reconcile(const fs::path& state, std::string_view vm) {
  if (auto id = check_vm_id(vm); !id) return id.error();
  std::error_code ec;
  fs::path dir = state / std::string(vm);
  if (!fs::is_directory(dir, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      return Error{fmt::format("{}: {}", dir.string(), ec.message())};
    return std::optional<VmState>{};
  }
  // Order matters: liveness first, then the record. A monitor that records its outcome and
  // exits between the two reads is then seen as alive-with-no-record (running, true when
  // checked) or as gone-with-its-record, never as gone-without-one.
  auto mon = load_monitor(state, vm);
  bool alive = mon.value && is_alive(mon.value->monitor);
  std::optional<ProcessIdentity> vmm = mon.value ? vmm_of(state, vm, mon.value->generation) : std::nullopt;
  bool vmm_alive = vmm && is_alive(*vmm);
  auto rec = load_record(state, vm);
  auto stop = load_stop(state, vm);

  if (!mon.value && !rec.value && !mon.error && !rec.error) return std::optional<VmState>{};

  VmState s;
  s.vm = std::string(vm);
  s.monitor = mon.value;
  s.generation = mon.value ? mon.value->generation : 0;
  if (rec.value && rec.value->generation > s.generation) {
    // A record newer than the monitor file: the monitor file is history (e.g. `serve` wrote this
    // generation); its process, alive or not, does not serve the recorded generation.
    s.generation = rec.value->generation;
    alive = false;
    vmm.reset();
    vmm_alive = false;
  }
  s.monitor_alive = alive;
  s.vmm = vmm;
  s.vmm_alive = vmm_alive;
  // The monitor gone and its VMM alive: the VM runs on, unmonitored until a neshost command
  // starts a replacement monitor (orphaned()); it is never taken for a failed one meanwhile.
  const bool served = alive || vmm_alive;
  const bool rec_same = rec.value && rec.value->generation == s.generation && rec.value->vm == vm;
  if (rec_same) s.record = rec.value;
  s.stop_requested = stop.value && stop.value->generation == s.generation && s.generation != 0;

  if (s.stop_requested && (rec_same || !served)) {
    s.status = VmStatus::stopped;
    s.exit_status = rec_same ? reported_status(*rec.value) : kStoppedStatus;
    const std::string by = stop.value->reason.empty()
                               ? fmt::format("stopped on request at {}", format_rfc3339(stop.value->requested_at))
                               : fmt::format("stopped by its monitor at {}: {}",
                                             format_rfc3339(stop.value->requested_at), stop.value->reason);
    s.reason = rec_same ? fmt::format("{}; then {}", by, describe(*rec.value))
                        : fmt::format("{}; the monitor exited without recording an outcome", by);
    return std::optional<VmState>{std::move(s)};
  }
  if (rec_same) {
    const Record& r = *rec.value;
    s.exit_status = reported_status(r);
    s.reason = describe(r);
    s.status = is_natural(r.outcome) ? VmStatus::exited
               : proto::to_string(r.outcome) == "stopped" ? VmStatus::stopped
                                                          : VmStatus::failed;
    return std::optional<VmState>{std::move(s)};
  }
  if (alive || vmm_alive) s.paused = paused_generation(state, vm) == s.generation;
  if (alive) {
    s.status = VmStatus::running;
    s.reason = s.stop_requested ? "stopping (stop requested)"
               : s.paused       ? "paused (its vCPUs stopped; neshost unpause resumes it)"
                                : "monitor alive, no outcome yet";
    return std::optional<VmState>{std::move(s)};
  }
  if (vmm_alive) {
    s.status = VmStatus::running;
    s.reason = fmt::format("{}the monitor (pid {}) of generation {} is gone; its VMM (pid {}) runs: a replacement "
                           "monitor takes it over",
                           s.stop_requested ? "stopping (stop requested); " : "", mon.value->monitor.pid,
                           s.generation, vmm->pid);
    return std::optional<VmState>{std::move(s)};
  }
  // The monitor is gone and left no valid outcome of this generation: failed, never running.
  s.status = VmStatus::failed;
  s.exit_status = proto::kStatusHostFailure;
  std::string who = mon.value ? fmt::format("the monitor (pid {}) of generation {} is gone",
                                            mon.value->monitor.pid, s.generation)
                              : std::string("no live monitor");
  if (rec.error)
    s.reason = fmt::format("{} and the outcome record is unreadable: {}", who, *rec.error);
  else if (rec.value && rec.value->vm != vm)
    s.reason = fmt::format("{} and the outcome record names another VM ('{}')", who, rec.value->vm);
  else if (rec.value)
    s.reason = fmt::format("{} without recording an outcome (the record on disk is of generation "
                           "{}: stale, ignored)", who, rec.value->generation);
  else if (mon.error)
    s.reason = fmt::format("the monitor file is unreadable ({}) and no outcome is recorded", *mon.error);
  else
    s.reason = fmt::format("{} without recording an outcome", who);
  return std::optional<VmState>{std::move(s)};
}

std::string encode_state(const VmState& s) {
  std::string head;
  if (s.record) {
    head = encode_record(*s.record);
    // Without its final "}\n" (exactly: an object field such as "lost" ends in '}' too).
    if (head.ends_with("}\n")) head.resize(head.size() - 2);
  } else {
    head = fmt::format(R"({{"vm":{},"generation":{},"outcome":null,"exit_status":{})", json_string(s.vm),
                       s.generation, s.exit_status ? std::to_string(*s.exit_status) : "null");
  }
  return fmt::format(R"({},"status":"{}","status_reason":{},"monitor_pid":{},"monitor_alive":{},)"
                     R"("stop_requested":{},"vmm_pid":{},"vmm_alive":{},"paused":{}}})"
                     "\n",
                     head, to_string(s.status), json_string(s.reason),
                     s.monitor ? std::to_string(s.monitor->monitor.pid) : "null", s.monitor_alive,
                     s.stop_requested, s.vmm ? std::to_string(s.vmm->pid) : "null", s.vmm_alive, s.paused);
}

std::string encode_wait(const VmState& s) {
  auto opt = [](const auto& v) { return v ? std::to_string(static_cast<int>(*v)) : std::string("null"); };
  std::string tail;
  if (s.record) {
    tail = fmt::format(R"(,"started_at":"{}","finished_at":"{}")", format_rfc3339(s.record->started_at),
                       format_rfc3339(s.record->finished_at));
    for (auto [name, c] : {std::pair{"lost", &s.record->lost}, std::pair{"truncated", &s.record->truncated}}) {
      if (c->empty()) continue;
      tail += fmt::format(R"(,"{}":{{)", name);
      if (c->out) tail += fmt::format(R"("stdout":{})", *c->out);
      if (c->err) tail += fmt::format(R"({}"stderr":{})", c->out ? "," : "", *c->err);
      tail += "}";
    }
  }
  const int status = s.exit_status.value_or(proto::kStatusHostFailure);
  return fmt::format(R"({{"vm":{},"generation":{},"status":"{}","outcome":{},"exit_code":{},"signal":{},)"
                     R"("exit_status":{},"reason":{}{}}})"
                     "\n",
                     json_string(s.vm), s.generation, to_string(s.status),
                     s.record ? fmt::format(R"("{}")", proto::to_string(s.record->outcome)) : std::string("null"),
                     s.record ? opt(s.record->exit_code) : "null", s.record ? opt(s.record->signal) : "null", status,
                     json_string(s.reason), tail);
}

Status mark_paused(const fs::path& state, std::string_view vm, std::uint64_t generation) {
  if (auto c = check_vm_id(vm); !c) return c;
  return write_durable(state / std::string(vm), kPausedFile, fmt::format("{}\n", generation));
}

Status clear_paused(const fs::path& state, std::string_view vm) {
  if (auto c = check_vm_id(vm); !c) return c;
  const fs::path p = vm_path(state, vm, kPausedFile);
  if (::unlink(p.c_str()) != 0 && errno != ENOENT)
    return Error{fmt::format("{}: unlink: {}", p.string(), std::strerror(errno))};
  return Ok{};
}

std::optional<std::uint64_t> paused_generation(const fs::path& state, std::string_view vm) {
  if (!check_vm_id(vm)) return std::nullopt;
  auto text = base::read_small_file(vm_path(state, vm, kPausedFile).c_str(), 64);
  if (!text) return std::nullopt;
  std::uint64_t g = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), g);
  if (ec != std::errc{} || g == 0) return std::nullopt;
  return g;
}

std::vector<std::string> list_vms(const fs::path& state) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(state, ec)) {
    auto name = e.path().filename().string();
    std::error_code ec2;
    if (check_vm_id(name) && e.is_directory(ec2) && !e.is_symlink(ec2)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status remove_vm(const fs::path& state, std::string_view vm, const std::optional<ProcessIdentity>& self) {
  auto locked = lock_existing_vm(state, vm);
  if (!locked) return locked.error();
  const fs::path& dir = locked->dir;
  if (auto mon = load_monitor(state, vm); mon.value && mon.value->monitor != self && is_alive(mon.value->monitor)) {
    auto rec = load_record(state, vm);
    bool newer_rec = rec.value && rec.value->generation > mon.value->generation;
    if (!newer_rec)
      return Error{fmt::format("VM '{}' is running (monitor pid {})", vm, mon.value->monitor.pid)};
  }
  if (auto mon = load_monitor(state, vm); mon.value && mon.value->monitor != self) {
    auto rec = load_record(state, vm);
    if (!(rec.value && rec.value->generation >= mon.value->generation))
      if (auto v = vmm_of(state, vm, mon.value->generation); v && is_alive(*v))
        return Error{fmt::format("VM '{}' is running (its monitor is gone; its VMM pid {} runs)", vm, v->pid)};
  }
  // The intent first (host/monitor/removal.hpp): a removal a crash cuts short is finished by
  // the next command that finds it.
  std::uint64_t gen = 1;
  if (auto mon = load_monitor(state, vm); mon.value) gen = std::max(gen, mon.value->generation);
  if (auto rec = load_record(state, vm); rec.value) gen = std::max(gen, rec.value->generation);
  return remove_dir_with_intent(dir, gen);
}

}  // namespace nes::host
