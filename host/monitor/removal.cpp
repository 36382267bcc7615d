#include "host/monitor/removal.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "base/small_file.hpp"
#include "host/lib/log_writer.hpp"
#include "host/monitor/fault_point.hpp"
#include "host/monitor/reconcile.hpp"

namespace nes::host {

namespace fs = std::filesystem;

namespace {

struct Intent {
  bool all = false;
  std::uint64_t generation = 0;
};

/// "scratch G\n" or "all G\n"; nullopt when absent or malformed (a torn write cannot be one: it
/// is renamed into place whole).
std::optional<Intent> read_intent(const fs::path& dir) {
  auto text = base::read_small_file((dir / kRemovingFile).c_str(), 64);
  if (!text) return std::nullopt;
  std::string_view t = *text;
  Intent in;
  if (t.starts_with("all ")) {
    in.all = true;
    t.remove_prefix(4);
  } else if (t.starts_with("scratch ")) {
    t.remove_prefix(8);
  } else {
    return std::nullopt;
  }
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), in.generation);
  if (ec != std::errc{} || in.generation == 0) return std::nullopt;
  return in;
}

Status unlink_intent(const fs::path& dir) {
  const fs::path p = dir / kRemovingFile;
  if (::unlink(p.c_str()) != 0 && errno != ENOENT)
    return Error{fmt::format("{}: unlink: {}", p.string(), std::strerror(errno))};
  return fsync_dir(dir);
}

/// The scratch files of the VM in `dir`; the first failure (ENOENT is none) is the error.
Status remove_scratch_files(const fs::path& dir) {
  std::vector<fs::path> files{dir / kConsoleLog, dir / kPasstLog};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("virtiofsd-") && n.ends_with(".log")) files.push_back(e.path());
  }
  const fs::path wl = dir / kWorkloadLog;
  for (auto& r : rotated_logs(wl)) files.push_back(r);
  files.push_back(wl);
  files.push_back(dir / (std::string(kWorkloadLog) + ".pos"));
  files.push_back(dir / "output.pos");  // host/monitor/output_resume.hpp kOutputPos: counts of the log's bytes
  bool first = true;
  for (const auto& f : files) {
    if (::unlink(f.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return Error{fmt::format("{}: unlink: {}", f.string(), std::strerror(errno))};
    }
    // A kill with the removal begun and not done: what the intent is for.
    if (std::exchange(first, false)) nes::monitor::fault_point("remove:partial");
  }
  return Ok{};
}

}  // namespace

void end_leftovers(const VmmInfo& v) {
  for (const auto& d : v.daemons) {
    if (Fd pidfd = pin_process(d.id)) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
  const fs::path& dir = v.runtime_dir;
  struct stat st {};
  if (!dir.is_absolute() || !dir.filename().string().starts_with("neshost-") || ::lstat(dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

Status remove_scratch(const fs::path& state, std::string_view vm, std::uint64_t generation) {
  if (auto c = check_vm_id(vm); !c) return c;
  const fs::path dir = state / std::string(vm);
  if (auto s = write_durable(dir, kRemovingFile, fmt::format("scratch {}\n", generation)); !s) return s;
  nes::monitor::fault_point("remove:intent");
  if (auto s = remove_scratch_files(dir); !s) return s;
  return unlink_intent(dir);
}

Status remove_dir_with_intent(const fs::path& dir, std::uint64_t generation) {
  if (auto s = write_durable(dir, kRemovingFile, fmt::format("all {}\n", generation)); !s) return s;
  nes::monitor::fault_point("remove:intent");
  // Everything but the lock and the intent first, then the intent, the lock, the directory: a
  // writer that opens the lock meanwhile finds no directory to write into afterwards. Listed
  // again until nothing else is left (an entry readdir skipped while others went), so the intent
  // goes only once the rest has: an error keeps it, and the next command tries again.
  bool first = true;
  for (int pass = 0;; ++pass) {
    std::error_code ec;
    std::vector<fs::path> left;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const auto n = it->path().filename();
      if (n != kLockFile && n != kRemovingFile && n != kVmmFile) left.push_back(it->path());
    }
    if (ec) return Error{fmt::format("{}: list: {}", dir.string(), ec.message())};
    if (left.empty()) break;
    if (pass == 3) return Error{fmt::format("{}: still left after 3 passes", left.front().string())};
    for (const auto& p : left) {
      fs::remove_all(p, ec);
      if (ec) return Error{fmt::format("{}: remove: {}", p.string(), ec.message())};
      if (std::exchange(first, false)) nes::monitor::fault_point("remove:partial");
    }
  }
  ::unlink((dir / kVmmFile).c_str());
  ::unlink((dir / kRemovingFile).c_str());
  ::unlink((dir / kLockFile).c_str());
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT)
    return Error{fmt::format("rmdir {}: {}", dir.string(), std::strerror(errno))};
  return Ok{};
}

Result<Finished> finish_removal(const fs::path& state, std::string_view vm) {
  if (auto c = check_vm_id(vm); !c) return c.error();
  const fs::path dir = state / std::string(vm);
  if (::access((dir / kRemovingFile).c_str(), F_OK) != 0) return Finished::nothing;
  Fd dirfd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (!dirfd) return errno == ENOENT ? Result<Finished>(Finished::nothing)
                                     : Error{fmt::format("{}: open: {}", dir.string(), std::strerror(errno))};
  auto lock = lock_vm(dirfd.get(), dir);
  if (!lock) return lock.error();
  // The lock is the directory we opened; the reads below go by path: while we waited, its owner
  // may have removed that directory and a new run made another one of the same name.
  struct stat held {}, now {};
  if (::fstat(dirfd.get(), &held) != 0 || ::stat(dir.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
      held.st_dev != now.st_dev)
    return Finished::nothing;
  auto in = read_intent(dir);  // again, under the lock: its owner may have finished meanwhile
  if (!in) {
    if (::access((dir / kRemovingFile).c_str(), F_OK) != 0) return Finished::nothing;
    if (auto s = unlink_intent(dir); !s) return s.error();
    return Finished::stale;
  }
  auto st = reconcile(state, vm);
  const std::uint64_t current = st && *st ? (*st)->generation : 0;
  if (in->all) {
    if (current > in->generation) {  // a newer generation began: not this intent's to remove
      if (auto s = unlink_intent(dir); !s) return s.error();
      return Finished::stale;
    }
    auto v = load_vmm(state, vm);  // before it goes: what the VM's processes left, if they are gone
    if (auto s = remove_dir_with_intent(dir, in->generation); !s) return s.error();
    if (v && *v && !(st && *st && ((*st)->monitor_alive || (*st)->vmm_alive))) end_leftovers(**v);
    return Finished::all;
  }
  if (current != in->generation) {
    if (auto s = unlink_intent(dir); !s) return s.error();
    return Finished::stale;
  }
  if (auto s = remove_scratch_files(dir); !s) return s.error();
  if (auto s = unlink_intent(dir); !s) return s.error();
  return Finished::scratch;
}

}  // namespace nes::host
