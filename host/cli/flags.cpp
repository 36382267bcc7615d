// The CLI's flag parser and value parsers (host/cli/flags.hpp).
#include "host/cli/flags.hpp"
#include "host/cli/flag_table.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "protocol/messages.hpp"

namespace nes::cli {

namespace {

const FlagSpec* find_long(std::span<const FlagSpec> specs, std::string_view name) {
  auto it = std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

const FlagSpec* find_short(std::span<const FlagSpec> specs, std::string_view form) {
  auto it = std::find_if(specs.begin(), specs.end(),
                         [&](const FlagSpec& s) { return !s.short_form.empty() && s.short_form == form; });
  return it == specs.end() ? nullptr : &*it;
}

void record(Parsed& p, std::string_view name, std::string value) {
  p.flags[std::string(name)] = value;
  p.given.emplace_back(std::string(name), std::move(value));
}

}  // namespace

host::Result<Parsed> parse_flags(std::span<const FlagSpec> specs, const Args& args, FlagOrder order) {
  Parsed p;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--") {
      p.after_dashdash = p.positional.size();
      for (++i; i < args.size(); ++i) p.positional.emplace_back(args[i]);
      return p;
    }
    // -h is help unless the spec gives it to a flag (docker run's -h is --hostname).
    if (a == "--help" || (a == "-h" && !find_short(specs, "-h"))) {
      p.help = true;
      continue;
    }
    if (!a.starts_with("-") || a == "-") {
      if (order == FlagOrder::anywhere) {
        p.positional.emplace_back(a);
        continue;
      }
      for (; i < args.size(); ++i) p.positional.emplace_back(args[i]);
      break;
    }
    if (!a.starts_with("--")) {
      // Short forms, alone or run together as getopt and docker's pflag read them: switches
      // (-it is -i -t), then at most one flag with a value, which is the rest of the argument
      // (-eK=V, -e=K=V, -n5) or else the next one (-e K=V, -ie K=V).
      std::string_view rest = a.substr(1);
      while (!rest.empty()) {
        const char form[2] = {'-', rest[0]};
        const FlagSpec* s = find_short(specs, std::string_view(form, 2));
        if (!s) return host::Error{fmt::format("unknown flag {}", a)};
        rest.remove_prefix(1);
        if (!s->takes_value) {
          record(p, s->name, "");
          continue;
        }
        if (rest.size() > 1 && rest[0] == '=') rest.remove_prefix(1);
        if (rest.empty()) {
          if (i + 1 >= args.size()) return host::Error{fmt::format("--{} needs a value", s->name)};
          rest = args[++i];
        }
        record(p, s->name, std::string(rest));
        break;
      }
      continue;
    }
    std::string_view name = a.substr(2);
    std::optional<std::string_view> value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = find_long(specs, name);
    if (!spec) return host::Error{fmt::format("unknown flag --{}", name)};
    if (!spec->takes_value) {
      if (value) return host::Error{fmt::format("--{} takes no value", spec->name)};
      record(p, spec->name, "");
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) return host::Error{fmt::format("--{} needs a value", spec->name)};
      value = args[++i];
    }
    record(p, spec->name, std::string(*value));
  }
  p.after_dashdash = p.positional.size();
  return p;
}

std::string flag_help_line(const FlagSpec& spec, std::string_view value_name, std::string_view help) {
  std::string names = spec.short_form.empty() ? fmt::format("--{}", spec.name)
                                              : fmt::format("{}, --{}", spec.short_form, spec.name);
  if (!value_name.empty()) names += fmt::format(" {}", value_name);
  constexpr std::size_t kColumn = 21;  // the text starts at column 23 ("  " + 21)
  std::string out = "  " + names;
  if (names.size() < kColumn) out.append(kColumn - names.size(), ' ');
  else out += "\n" + std::string(2 + kColumn, ' ');
  for (std::size_t at = 0;;) {
    const auto nl = help.find('\n', at);
    out += help.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    out += '\n';
    if (nl == std::string_view::npos) break;
    at = nl + 1;
    out.append(2 + kColumn, ' ');
  }
  return out;
}

host::Result<std::chrono::milliseconds> parse_seconds(std::string_view flag, std::string_view v) {
  double s = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), s);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(s) || s <= 0 ||
      s > 31.0 * 24 * 3600)
    return host::Error{fmt::format("--{}: expected seconds > 0 (e.g. 30 or 0.5), got '{}'", flag, v)};
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(s * 1000)));
}

host::Result<std::uint64_t> parse_uint(std::string_view flag, std::string_view v, std::uint64_t lo,
                                       std::uint64_t hi) {
  std::uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi)
    return host::Error{fmt::format("--{}: expected an integer {}..{}, got '{}'", flag, lo, hi, v)};
  return x;
}

host::Result<std::pair<std::uint32_t, std::uint32_t>> parse_user(std::string_view v) {
  auto colon = v.find(':');
  auto uid = parse_uint("user", v.substr(0, colon), 0, proto::kInvalidId - 1);
  if (!uid) return host::Error{fmt::format("--user: expected UID[:GID] (numbers), got '{}'", v)};
  std::uint64_t gid = *uid;
  if (colon != std::string_view::npos) {
    auto g = parse_uint("user", v.substr(colon + 1), 0, proto::kInvalidId - 1);
    if (!g) return host::Error{fmt::format("--user: expected UID[:GID] (numbers), got '{}'", v)};
    gid = *g;
  }
  return std::pair{static_cast<std::uint32_t>(*uid), static_cast<std::uint32_t>(gid)};
}

host::Result<std::optional<std::pair<std::string, std::string>>> parse_env(std::string_view v) {
  using Var = std::optional<std::pair<std::string, std::string>>;
  auto eq = v.find('=');
  if (eq == 0 || v.empty()) return host::Error{fmt::format("--env: expected K=V or K, got '{}'", v)};
  if (eq != std::string_view::npos) return Var{{std::string(v.substr(0, eq)), std::string(v.substr(eq + 1))}};
  const std::string key(v);
  if (const char* val = std::getenv(key.c_str())) return Var{{key, val}};
  return Var{};
}

host::Result<std::string> parse_workdir(std::string_view v) {
  if (!v.starts_with("/")) return host::Error{fmt::format("--workdir: '{}' is not an absolute path", v)};
  return std::string(v);
}

}  // namespace nes::cli
