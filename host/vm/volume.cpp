#include "host/vm/volume.hpp"

#include <fmt/format.h>

namespace nes::vm {

namespace fs = std::filesystem;

host::Status check_guest_path(std::string_view g, bool file) {
  if (g.empty() || g[0] != '/') return host::Error{"GUEST must be an absolute path"};
  std::size_t s = 0;
  while (s < g.size()) {
    std::size_t e = g.find('/', s + 1);
    std::string_view comp = g.substr(s + 1, (e == std::string_view::npos ? g.size() : e) - s - 1);
    if (comp == "." || comp == "..") return host::Error{"GUEST must not contain '.' or '..' components"};
    if (e == std::string_view::npos) break;
    s = e;
  }
  if (g.find_first_not_of('/') == std::string_view::npos) return host::Error{"GUEST must not be / (see --rootfs)"};
  for (std::string_view r : {"/proc", "/sys", "/dev"}) {
    if (file && r == "/dev" && g.size() > r.size()) continue;
    if (g.starts_with(r) && (g.size() == r.size() || g[r.size()] == '/'))
      return host::Error{fmt::format("GUEST must not be {} or below it (the init mounts it)", r)};
  }
  return host::Ok{};
}

namespace {
std::string normalise(std::string_view g) {
  std::string out;
  std::size_t s = 0;
  while (s < g.size()) {
    std::size_t e = g.find('/', s);
    if (e == std::string_view::npos) e = g.size();
    if (e > s) out += "/" + std::string(g.substr(s, e - s));
    s = e + 1;
  }
  return out.empty() ? "/" : out;
}
}  // namespace

host::Result<Volume> parse_volume(std::string_view spec) {
  auto fail = [&](std::string_view why) {
    return host::Error{fmt::format("--volume '{}': {} (expected HOST:GUEST[:ro])", spec, why)};
  };
  std::vector<std::string_view> parts;
  std::size_t s = 0;
  while (true) {
    std::size_t c = spec.find(':', s);
    parts.push_back(spec.substr(s, c == std::string_view::npos ? std::string_view::npos : c - s));
    if (c == std::string_view::npos) break;
    s = c + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) return fail("not HOST:GUEST or HOST:GUEST:OPTION");
  Volume v;
  if (parts.size() == 3) {
    if (parts[2] == "ro") v.ro = true;
    else if (parts[2] != "rw") return fail(fmt::format("option '{}' is not ro or rw", parts[2]));
  }
  if (parts[0].empty()) return fail("HOST is empty");
  std::error_code ec;
  fs::path host = fs::absolute(fs::path(parts[0]), ec);
  fs::file_status st = fs::status(host, ec);
  if (!fs::exists(st)) return fail(fmt::format("HOST {} does not exist", host.string()));
  if (!fs::is_directory(st) && !fs::is_regular_file(st))
    return fail(fmt::format("HOST {} is neither a directory nor a regular file", host.string()));
  v.file = fs::is_regular_file(st);
  v.host = fs::canonical(host, ec);
  if (ec) return fail(fmt::format("HOST {}: {}", host.string(), ec.message()));
  if (auto g = check_guest_path(parts[1], v.file); !g) return fail(g.error().message);
  v.guest = normalise(parts[1]);
  return v;
}

host::Status check_volumes(const std::vector<Volume>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (v[i].guest == v[j].guest)
        return host::Error{fmt::format("--volume: GUEST {} is given twice", v[i].guest)};
  return host::Ok{};
}

}  // namespace nes::vm
