// A pod's container's mounts through the pod's share (host/shim/pod_mounts.hpp).
#include "host/shim/pod_mounts.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "host/shim/task_mounts.hpp"

namespace nes::shim {
namespace fs = std::filesystem;
using host::Error;

bool carried(const Volume& v) {
  return v.guest != "/etc/hosts" && v.guest != "/etc/resolv.conf" && v.guest != "/etc/hostname";
}

host::Status mount_pod_volumes(const fs::path& share, const std::string& dir, const TaskSpec& sp) {
  std::size_t n = 0;
  for (const Volume& v : sp.volumes) {
    if (!carried(v)) continue;
    const std::string name = fmt::format("m{}", n++);
    const fs::path real = pod_share_real(share, fs::path(dir) / name);
    const fs::path at = share / dir / name;
    auto fail = [&](std::string_view what) {
      return Error{fmt::format("mounts (destination {}): {} {} on {}: {}", v.guest, what, v.host.string(), at.string(),
                               std::strerror(errno))};
    };
    std::error_code ec;
    if (fs::is_directory(v.host, ec)) {
      if (::mkdir(real.c_str(), 0755) != 0 && errno != EEXIST) return fail("mkdir for");
    } else {
      host::Fd f(::open(real.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
      if (!f) return fail("create the mount point for");
    }
    if (::mount(v.host.c_str(), at.c_str(), nullptr, MS_BIND | (v.rbind ? MS_REC : 0), nullptr) != 0) return fail("bind");
    const unsigned long flags = (v.ro ? MS_RDONLY : 0) | (v.nosuid ? MS_NOSUID : 0) | (v.nodev ? MS_NODEV : 0) |
                                (v.noexec ? MS_NOEXEC : 0);
    // A bind ignores its flags until remounted with them.
    if (flags && ::mount(nullptr, at.c_str(), nullptr, MS_REMOUNT | MS_BIND | flags, nullptr) != 0) return fail("remount");
  }
  return host::Ok{};
}

void unmount_pod_volumes(const fs::path& share, const std::string& dir) {
  const fs::path real = pod_share_real(share, dir);
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(real, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() > 1 && n[0] == 'm' && std::all_of(n.begin() + 1, n.end(), [](char c) { return c >= '0' && c <= '9'; }))
      names.push_back(n);
  }
  for (const auto& n : names) {
    ::umount2((share / dir / n).c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
    const fs::path p = real / n;
    if (::unlink(p.c_str()) != 0) ::rmdir(p.c_str());  // an empty file or an empty directory
  }
}

std::vector<proto::ContainerMount> pod_guest_mounts(const TaskSpec& sp, std::string_view guest_dir) {
  std::vector<proto::ContainerMount> out;
  std::size_t n = 0;
  for (const Volume& v : sp.volumes) {
    if (!carried(v)) continue;
    proto::ContainerMount m;
    m.dst = v.guest;
    m.src = fmt::format("{}/m{}", guest_dir, n++);
    m.fs = proto::FsType::bind;
    m.ro = v.ro, m.nosuid = v.nosuid, m.nodev = v.nodev, m.noexec = v.noexec;
    m.propagation = v.propagation;
    out.push_back(std::move(m));
  }
  for (const Tmpfs& t : sp.tmpfs) {
    proto::ContainerMount m;
    m.dst = t.guest;
    m.fs = proto::FsType::tmpfs;
    m.ro = t.ro, m.nosuid = t.nosuid, m.nodev = t.nodev, m.noexec = t.noexec;
    m.data = t.data;
    out.push_back(std::move(m));
  }
  auto depth = [](const std::string& p) { return std::count(p.begin(), p.end(), '/'); };
  std::stable_sort(out.begin(), out.end(),
                   [&](const proto::ContainerMount& a, const proto::ContainerMount& b) { return depth(a.dst) < depth(b.dst); });
  return out;
}

}  // namespace nes::shim
