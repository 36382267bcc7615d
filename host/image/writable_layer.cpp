#include "host/image/writable_layer.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "host/image/tool.hpp"

namespace nes::image {

namespace fs = std::filesystem;

namespace {

/// docker's units.RAMInBytes: "10", "10k", "10MB", "1.5g", "2GiB" (binary multiples).
std::optional<std::uint64_t> parse_size(std::string_view v) {
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  std::string num(v.substr(0, i));
  if (num.empty() || num.front() == '.' || num.find('.') != num.rfind('.') || num.size() > 20) return std::nullopt;
  std::string unit;
  for (char c : v.substr(i)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.size() >= 2 && unit.ends_with("ib")) unit.erase(unit.size() - 2, 1);  // "gib" -> "gb"
  if (unit.size() == 2 && unit[1] == 'b' && unit[0] != 'b') unit.pop_back();     // "gb" -> "g"
  int shift;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k") shift = 10;
  else if (unit == "m") shift = 20;
  else if (unit == "g") shift = 30;
  else if (unit == "t") shift = 40;
  else if (unit == "p") shift = 50;
  else return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(num.c_str(), &end);
  if (!end || *end) return std::nullopt;
  double bytes = d * static_cast<double>(1ull << shift);
  if (bytes >= 18446744073709551615.0) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace

Status apply_storage_opt(std::string_view opt, StorageOpts& opts) {
  auto bad = [&](std::string_view why) { return Error{fmt::format("--storage-opt '{}': {}", opt, why), EINVAL}; };
  auto eq = opt.find('=');
  if (eq == std::string_view::npos) return bad("expected KEY=VALUE (size=10G, persistent=true)");
  std::string_view key = opt.substr(0, eq), value = opt.substr(eq + 1);
  if (key == "size") {
    auto n = parse_size(value);
    if (!n) return bad("size: not a size (a number with an optional k, m, g, t suffix)");
    if (*n < kMinUpperBytes || *n > kMaxUpperBytes)
      return bad(fmt::format("size: {} bytes is outside {} MiB .. {} TiB", *n, kMinUpperBytes >> 20, kMaxUpperBytes >> 40));
    opts.size = *n;
    return Ok{};
  }
  if (key == "persistent") {
    if (value == "true" || value == "1") opts.persistent = true;
    else if (value == "false" || value == "0") opts.persistent = false;
    else return bad("persistent: expected true or false");
    return Ok{};
  }
  return bad(fmt::format("unknown key '{}' (size, persistent)", key));
}

Result<bool> ensure_upper_disk(const fs::path& path, std::uint64_t bytes) {
  if (bytes < kMinUpperBytes || bytes > kMaxUpperBytes)
    return Error{fmt::format("writable layer {}: {} bytes is outside {} MiB .. {} TiB", path.string(), bytes,
                             kMinUpperBytes >> 20, kMaxUpperBytes >> 40),
                 EINVAL};
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return Error{fmt::format("writable layer {}: not a regular file", path.string())};
    return false;  // the VM's layer from an earlier run: kept
  }
  if (errno != ENOENT) return host::errno_error(errno, fmt::format("writable layer {}", path.string()));
  std::string tmpl = path.string() + ".tmp-XXXXXX";
  host::Fd fd(::mkstemp(tmpl.data()));
  if (!fd) return host::errno_error(errno, fmt::format("writable layer: mkstemp beside {}", path.string()));
  fd.reset();
  struct Cleanup {
    std::string p;
    ~Cleanup() {
      if (!p.empty()) ::unlink(p.c_str());
    }
  } cleanup{tmpl};
  // 4 KiB blocks, root's root directory (the overlay's upper and work go under it), lazy inode
  // tables (the file stays sparse: only what mke2fs writes is allocated).
  auto s = run_tool({"mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-E",
                     "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1", tmpl, std::to_string(bytes / 1024) + "k"},
                    "e2fsprogs");
  if (!s) return Error{fmt::format("writable layer {}: {}", path.string(), s.error().message), s.error().err};
  fd = host::Fd(::open(tmpl.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) return host::errno_error(errno, fmt::format("fsync {}", tmpl));
  if (::rename(tmpl.c_str(), path.c_str()) != 0)
    return host::errno_error(errno, fmt::format("writable layer: rename into {}", path.string()));
  cleanup.p.clear();
  return true;
}

}  // namespace nes::image
