#include "host/image/run_image.hpp"

#include <charconv>
#include <set>

#include <fmt/format.h>

namespace nes::image {

namespace {

std::optional<std::uint32_t> number(std::string_view s) {
  std::uint32_t v = 0;
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == UINT32_MAX) return std::nullopt;
  return v;
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  for (;;) {
    size_t j = line.find(':', i);
    out.push_back(line.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

/// Each non-comment line of an /etc/passwd- or /etc/group-shaped file, split on ':'.
template <class F>
void each_line(std::string_view file, F&& f) {
  size_t i = 0;
  while (i < file.size()) {
    size_t j = file.find('\n', i);
    std::string_view line = file.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i);
    i = j == std::string_view::npos ? file.size() : j + 1;
    if (line.empty() || line.front() == '#') continue;
    if (f(fields(line))) return;
  }
}

}  // namespace

Result<RunSpec> resolve_user(std::string_view user, std::string_view passwd, std::string_view group) {
  RunSpec s;
  if (user.empty()) return s;
  std::string_view u = user, g;
  bool has_group = false;
  if (auto c = user.find(':'); c != std::string_view::npos) {
    u = user.substr(0, c);
    g = user.substr(c + 1);
    has_group = true;
  }
  std::string name;  // the passwd entry's name, for supplementary groups
  bool found = false;
  each_line(passwd, [&](const std::vector<std::string_view>& f) {
    if (f.size() < 4) return false;
    auto uid = number(f[2]), gid = number(f[3]);
    if (!uid || !gid) return false;
    if (f[0] == u || (number(u) && *number(u) == *uid)) {
      s.uid = *uid;
      s.gid = *gid;
      name = f[0];
      found = true;
      return true;
    }
    return false;
  });
  if (!found) {
    auto n = number(u);
    if (!n) return Error{fmt::format("unable to find user {}: no matching entries in passwd file", u)};
    s.uid = *n;
    s.gid = 0;
  }
  if (has_group) {
    bool gfound = false;
    each_line(group, [&](const std::vector<std::string_view>& f) {
      if (f.size() < 3) return false;
      auto gid = number(f[2]);
      if (gid && (f[0] == g || (number(g) && *number(g) == *gid))) {
        s.gid = *gid;
        gfound = true;
        return true;
      }
      return false;
    });
    if (!gfound) {
      auto n = number(g);
      if (!n) return Error{fmt::format("unable to find group {}: no matching entries in group file", g)};
      s.gid = *n;
    }
  }
  // supplementary groups: every group listing the user by name (docker's, through libcontainer)
  std::set<std::uint32_t> extra;
  if (!name.empty())
    each_line(group, [&](const std::vector<std::string_view>& f) {
      if (f.size() < 4) return false;
      auto gid = number(f[2]);
      if (!gid) return false;
      std::string_view members = f[3];
      size_t i = 0;
      while (i <= members.size()) {
        size_t j = members.find(',', i);
        if (j == std::string_view::npos) j = members.size();
        if (members.substr(i, j - i) == name) extra.insert(*gid);
        i = j + 1;
      }
      return false;
    });
  s.groups.assign(extra.begin(), extra.end());
  return s;
}

Result<RunSpec> resolve_run(const ImageConfig& config, const RunOverrides& over, std::string_view passwd,
                            std::string_view group) {
  auto s = resolve_user(over.user ? *over.user : config.user, passwd, group);
  if (!s) return Error{fmt::format("{}: {}", over.user ? "--user" : "the image's User", s.error().message)};
  RunSpec r = std::move(*s);
  std::vector<std::string> entry = config.entrypoint, cmd = config.cmd;
  if (over.entrypoint) {
    entry.clear();
    if (!over.entrypoint->empty()) entry.push_back(*over.entrypoint);
    cmd.clear();  // docker: --entrypoint resets the image's Cmd
  }
  if (!over.args.empty()) cmd = over.args;
  r.argv = entry;
  r.argv.insert(r.argv.end(), cmd.begin(), cmd.end());
  if (r.argv.empty()) return Error{"no command specified: the image has no Entrypoint or Cmd and none was given"};
  for (const auto& kv : config.env) {
    auto eq = kv.find('=');
    if (eq == 0) return Error{fmt::format("the image's Env: entry '{}' has no name", kv)};
    if (eq == std::string::npos) r.env[kv] = "";
    else r.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : over.env) r.env[k] = v;
  std::string wd = over.workdir ? *over.workdir : config.working_dir;
  if (wd.empty()) wd = "/";
  if (wd.front() != '/') wd = "/" + wd;  // docker makes a relative WorkingDir absolute
  r.workdir = wd;
  return r;
}

}  // namespace nes::image
