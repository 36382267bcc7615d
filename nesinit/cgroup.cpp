#include "cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include <fmt/format.h>

#include "base/small_file.hpp"

namespace nes::init {

namespace {

constexpr std::uint64_t kMax53 = proto::kResourceMax;

/// Writes `text` to `dir/file` (one write(2), as cgroupfs wants; O_TRUNC as runc opens them);
/// the Error names `field`, the value and the file.
base::Status put(const std::string& dir, const char* file, std::string_view field, const std::string& text) {
  const std::string path = dir + "/" + file;
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) err = errno ? errno : EIO;
    ::close(fd);
  }
  if (err == 0) return base::Ok{};
  return base::errno_error(err, fmt::format("{}: write {} to {}", field, text, path));
}

/// The file's text ("" when it cannot be read).
std::string get(const std::string& dir, const char* file) {
  auto r = base::read_small_file((dir + "/" + file).c_str(), 8192, {.longer = base::Longer::truncate});
  return r ? std::move(*r) : std::string();
}

/// The decimal number at the front of `s` ("max" and anything else: 0), capped at 2^53-1.
std::uint64_t number(std::string_view s) {
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') break;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
    if (v > kMax53) return kMax53;
  }
  return v;
}

/// The value of `key` in a flat-keyed file ("key value" lines: memory.stat, cpu.stat); 0 if absent.
std::uint64_t keyed(std::string_view text, std::string_view key) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ')
      return number(line.substr(key.size() + 1));
    at = end + 1;
  }
  return 0;
}

std::string limit_text(std::uint64_t v) { return v == 0 ? std::string("max") : fmt::format("{}", v); }

}  // namespace

base::Status write_resources(const std::string& dir, const proto::ContainerResources& r, bool no_shrink_below_use) {
  if (r.memory_max) {
    if (no_shrink_below_use && *r.memory_max != 0) {
      std::uint64_t used = number(get(dir, "memory.current"));
      if (used > *r.memory_max) {
        // What the kernel can give back (page cache) it gives back now; what it cannot (the
        // workload's own memory) would be taken by the OOM killer once memory.max is written:
        // refused instead, the container untouched. memory.reclaim's EAGAIN (not all reclaimed)
        // is what the re-read tells.
        (void)put(dir, "memory.reclaim", "memory_max", fmt::format("{}", used - *r.memory_max));
        used = number(get(dir, "memory.current"));
        if (used > *r.memory_max)
          return base::Error{fmt::format("memory_max: {} bytes is below the {} bytes the container uses "
                                         "(memory.current, after reclaim); not lowered",
                                         *r.memory_max, used),
                             EBUSY};
      }
    }
    if (auto s = put(dir, "memory.max", "memory_max", limit_text(*r.memory_max)); !s) return s;
  }
  if (r.cpu_quota || r.cpu_period) {
    // cpu.max is "QUOTA PERIOD": what `r` leaves unset is kept as the file has it.
    const std::string now = get(dir, "cpu.max");
    const std::size_t sp = now.find(' ');
    std::uint64_t period = r.cpu_period.value_or(sp == std::string::npos ? 100000 : number(now.substr(sp + 1)));
    if (period == 0) period = 100000;
    std::string quota = r.cpu_quota ? limit_text(*r.cpu_quota) : (now.starts_with("max") || now.empty() ? "max" : fmt::format("{}", number(now)));
    if (auto s = put(dir, "cpu.max", r.cpu_quota ? "cpu_quota" : "cpu_period", fmt::format("{} {}", quota, period)); !s)
      return s;
  }
  if (r.cpu_weight)
    if (auto s = put(dir, "cpu.weight", "cpu_weight", fmt::format("{}", *r.cpu_weight)); !s) return s;
  if (r.pids_max)
    if (auto s = put(dir, "pids.max", "pids_max", limit_text(*r.pids_max)); !s) return s;
  return base::Ok{};
}

base::Result<proto::CgroupStats> read_stats(const std::string& dir) {
  const std::string current = get(dir, "memory.current");
  if (current.empty()) return base::Error{fmt::format("read {}/memory.current: the cgroup is gone", dir), ENOENT};
  proto::CgroupStats s;
  s.memory_current = number(current);
  s.memory_max = number(get(dir, "memory.max"));
  const std::string mem = get(dir, "memory.stat");
  s.memory_anon = keyed(mem, "anon");
  s.memory_file = keyed(mem, "file");
  s.oom_kills = keyed(get(dir, "memory.events"), "oom_kill");
  const std::string cpu = get(dir, "cpu.stat");
  s.cpu_usage_usec = keyed(cpu, "usage_usec");
  s.cpu_user_usec = keyed(cpu, "user_usec");
  s.cpu_system_usec = keyed(cpu, "system_usec");
  s.cpu_nr_periods = keyed(cpu, "nr_periods");
  s.cpu_nr_throttled = keyed(cpu, "nr_throttled");
  s.cpu_throttled_usec = keyed(cpu, "throttled_usec");
  s.pids_current = number(get(dir, "pids.current"));
  s.pids_max = number(get(dir, "pids.max"));
  return s;
}

std::string ContainerCgroups::dir(std::uint16_t proc) const { return fmt::format("{}/ctr-{}", root_, proc); }

base::Result<std::string> ContainerCgroups::create(std::uint16_t proc,
                                                   const std::optional<proto::ContainerResources>& r) {
  if (!enabled_) {
    // Each controller on its own: one the kernel lacks does not keep the others off (a limit
    // that needs it then fails below, naming its field).
    for (const char* c : {"+memory", "+cpu", "+pids"}) (void)put(root_, "cgroup.subtree_control", "controllers", c);
    enabled_ = true;
  }
  const std::string d = dir(proc);
  if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return base::errno_error(errno, fmt::format("mkdir {}", d));
  if (r) {
    if (auto s = write_resources(d, *r); !s) {
      ::rmdir(d.c_str());
      return std::move(s).error();
    }
  }
  if (live_.size() >= kMaxEnded * 2) sweep();
  live_.push_back({proc, -1});  // starting: neither running nor ended
  return d + "/cgroup.procs";
}

void ContainerCgroups::started(std::uint16_t proc, pid_t pid) {
  for (Entry& e : live_)
    if (e.proc == proc && e.pid < 0) e.pid = pid;
}

void ContainerCgroups::failed(std::uint16_t proc) {
  for (Entry& e : live_)
    if (e.proc == proc && e.pid < 0) e.pid = 0;
  sweep();
}

void ContainerCgroups::reaped(pid_t pid) {
  for (Entry& e : live_)
    if (e.pid == pid) e.pid = 0;
  sweep();
}

void ContainerCgroups::sweep() {
  std::erase_if(live_, [&](const Entry& e) {
    if (e.pid != 0) return false;
    return ::rmdir(dir(e.proc).c_str()) == 0 || errno == ENOENT;
  });
  // Bounded: the oldest ended cgroups that stay busy are forgotten (left in the VM, empty soon).
  std::size_t ended = std::count_if(live_.begin(), live_.end(), [](const Entry& e) { return e.pid == 0; });
  for (auto it = live_.begin(); ended > kMaxEnded && it != live_.end();)
    if (it->pid == 0) it = live_.erase(it), --ended;
    else ++it;
}

std::optional<std::string> ContainerCgroups::running(std::uint16_t proc) const {
  for (const Entry& e : live_)
    if (e.proc == proc && e.pid > 0) return dir(proc);
  return std::nullopt;
}

std::string ContainerCgroups::procs_of(pid_t pid, const std::string& proc) const {
  // cgroup v2 alone: one line, "0::/PATH".
  auto r = base::read_small_file(fmt::format("{}/{}/cgroup", proc, pid).c_str(), 4096, {.longer = base::Longer::truncate});
  if (!r) return {};
  std::string_view t = *r;
  if (!t.starts_with("0::/ctr-")) return {};
  t.remove_prefix(3);
  if (auto nl = t.find('\n'); nl != std::string_view::npos) t = t.substr(0, nl);
  if (t.find('/', 1) != std::string_view::npos) return {};
  return fmt::format("{}{}/cgroup.procs", root_, t);
}

}  // namespace nes::init
