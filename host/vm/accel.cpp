#include "host/vm/accel.hpp"

#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "host/lib/base.hpp"
#include "base/small_file.hpp"
#include "host/vm/process.hpp"

namespace nes::vm {

KvmProbe kvm_device_usable(const std::filesystem::path& dev) {
  host::Fd fd(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return {false, fmt::format("{}: {}", dev.native(), std::strerror(errno))};
  int v = ::ioctl(fd.get(), KVM_GET_API_VERSION, 0);
  if (v != KVM_API_VERSION)
    return {false, fmt::format("{}: KVM_GET_API_VERSION gave {}, want {}", dev.native(), v,
                               KVM_API_VERSION)};
  return {true, fmt::format("{} answers KVM API {}", dev.native(), v)};
}

KvmProbe probe_kvm_boot(const std::string& qemu, const std::filesystem::path& kernel,
                        std::chrono::milliseconds deadline) {
  QemuSpec spec;
  spec.qemu = qemu;
  spec.kernel = kernel;
  spec.accel = Accel::kvm;
  spec.mem_mib = 128;
  // loglevel=1: only KERN_EMERG, i.e. the panic line we look for.
  spec.append = "console=ttyS0 loglevel=1 panic=-1 root=/dev/nonexistent";
  auto argv = qemu_argv(spec);
  if (!argv) return {false, "probe: " + argv.error().message};

  std::mutex mu;
  std::string console;
  LaunchOptions o;
  o.argv = std::move(argv).value();
  o.console = [&](std::string_view b) {
    std::lock_guard lk(mu);
    if (console.size() < 65536) console.append(b);
  };
  auto p = VmProcess::launch(std::move(o));
  if (!p) return {false, "probe: " + p.error().message};
  auto exited = (*p)->wait_for(deadline);
  if (!exited) {
    (*p)->terminate(std::chrono::milliseconds(0));
    (*p)->finish_output(std::chrono::milliseconds(500));
    return {false, fmt::format("a KVM guest did not finish booting within {} ms (hung)",
                               deadline.count())};
  }
  (*p)->finish_output(std::chrono::milliseconds(1000));
  std::lock_guard lk(mu);
  if (console.find("Kernel panic") == std::string::npos)
  {
    // QEMU's last words on one line (they are said inside another line: `accel tcg (...)`).
    std::string tail = (*p)->diagnostics_tail().substr(0, 200);
    std::replace(tail.begin(), tail.end(), '\n', ' ');
    while (!tail.empty() && tail.back() == ' ') tail.pop_back();
    return {false, fmt::format("the KVM probe guest {} without reaching the kernel's panic line ({})",
                               describe(*exited), tail)};
  }
  return {true, "a KVM probe guest booted to its expected panic"};
}

std::string probe_key(const std::string& qemu, const std::filesystem::path& kernel) {
  // A UUID and a newline (random(4)): anything shorter is no boot_id.
  auto id = base::read_small_file("/proc/sys/kernel/random/boot_id", 63, {.longer = base::Longer::truncate});
  if (!id || id->size() < 32) return "";
  std::string boot = std::move(*id);
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  struct stat st {};
  std::error_code ec;
  const auto k = std::filesystem::canonical(kernel, ec);
  if (ec || ::stat(k.c_str(), &st) != 0) return "";
  return fmt::format("{} {} {} {} {}.{:09}", boot, qemu, k.native(), st.st_size, st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
}

std::filesystem::path default_probe_cache() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x == '/')
    return std::filesystem::path(x) / "neshost" / "kvm-probe";
  if (::geteuid() == 0) return "/run/neshost/kvm-probe";
  return {};
}

// The file: four lines — key, "usable" or "unusable", the time it was probed (s), the reason.
std::optional<KvmProbe> cached_probe(const std::filesystem::path& file, const std::string& key,
                                     std::int64_t now_s) {
  if (file.empty() || key.empty()) return std::nullopt;
  auto text = base::read_small_file(file.c_str(), 4096, {.longer = base::Longer::truncate});
  if (!text) return std::nullopt;
  std::string_view t(*text);
  std::string_view lines[4];
  for (auto& l : lines) {
    auto nl = t.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;
    l = t.substr(0, nl);
    t.remove_prefix(nl + 1);
  }
  if (lines[0] != key || (lines[1] != "usable" && lines[1] != "unusable")) return std::nullopt;
  std::int64_t at = 0;
  for (char c : lines[2]) {
    if (c < '0' || c > '9' || at > (INT64_MAX - 9) / 10) return std::nullopt;
    at = at * 10 + (c - '0');
  }
  const bool usable = lines[1] == "usable";
  if (lines[2].empty() || at > now_s || (!usable && now_s - at >= kUnusableTtl.count())) return std::nullopt;
  return KvmProbe{usable, fmt::format("{} (cached from a probe {} s ago)", lines[3], now_s - at)};
}

void store_probe(const std::filesystem::path& file, const std::string& key, const KvmProbe& r,
                 std::int64_t now_s) {
  if (file.empty() || key.empty()) return;
  ::mkdir(file.parent_path().c_str(), 0700);
  std::string reason = r.reason;
  for (char& c : reason)
    if (c == '\n') c = ' ';
  const std::string text =
      fmt::format("{}\n{}\n{}\n{}\n", key, r.usable ? "usable" : "unusable", now_s, reason.substr(0, 1024));
  const std::string tmp = fmt::format("{}.{}", file.native(), ::getpid());
  host::Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!f) return;
  bool ok = ::write(f.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  f = host::Fd();
  if (!ok || ::rename(tmp.c_str(), file.c_str()) != 0) ::unlink(tmp.c_str());
}

KvmProbe probe_kvm_boot_cached(const std::string& qemu, const std::filesystem::path& kernel,
                               const std::filesystem::path& cache, std::int64_t now_s,
                               const std::function<KvmProbe()>& device, const std::function<KvmProbe()>& boot) {
  KvmProbe dev = device ? device() : kvm_device_usable();
  if (!dev.usable) return dev;  // no device: nothing to boot, nothing worth remembering
  const std::string key = probe_key(qemu, kernel);
  if (auto c = cached_probe(cache, key, now_s)) return *c;
  KvmProbe r = boot ? boot() : probe_kvm_boot(qemu, kernel);
  store_probe(cache, key, r, now_s);
  return r;
}

Accel resolve_accel(Accel requested, const std::function<KvmProbe()>& probe, std::string* why) {
  if (requested != Accel::auto_probe) {
    if (why) *why = fmt::format("{} requested", to_string(requested));
    return requested;
  }
  KvmProbe r = probe();
  if (why) *why = r.reason;
  return r.usable ? Accel::kvm : Accel::tcg;
}

}  // namespace nes::vm
