// linux.resources -> proto::ContainerResources (host/shim/resources.hpp).
#include "host/shim/resources.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

namespace nes::shim {
namespace dom = simdjson::dom;
using host::Error;
using host::Result;

namespace {

using Out = std::optional<proto::ContainerResources>;

/// A signed number field: -1 (`no_limit`, e.g. memory.limit), 0 (unset) or 1..2^53-1.
Result<std::optional<std::uint64_t>> limit(dom::element v, const std::string& f, std::string_view unit,
                                           std::uint64_t min = 1) {
  std::int64_t x = 0;
  if (v.is_null()) return std::optional<std::uint64_t>{};
  if (v.get_int64().get(x))
    return Error{fmt::format("{}: expected an integer ({} > 0, or -1 for no limit)", f, unit)};
  if (x == -1) return std::optional<std::uint64_t>{0};  // the wire's "max"
  if (x == 0) return std::optional<std::uint64_t>{};
  if (x < 0) return Error{fmt::format("{}: expected {} > 0, or -1 for no limit, got {}", f, unit, x)};
  if (static_cast<std::uint64_t>(x) > proto::kResourceMax || static_cast<std::uint64_t>(x) < min)
    return Error{fmt::format("{}: {} is out of range ({}..{})", f, x, min, proto::kResourceMax)};
  return std::optional<std::uint64_t>{static_cast<std::uint64_t>(x)};
}

/// A field accepted and ignored must still be a number (or null) when the spec says it is one.
host::Status number_or_null(dom::element v, const std::string& f) {
  if (v.is_null() || v.is_int64() || v.is_uint64() || v.is_double() || v.is_bool() || v.is_string()) {
    std::int64_t x = 0;
    if (!v.get_int64().get(x) && x < -1) return Error{fmt::format("{}: expected a value >= -1, got {}", f, x)};
    return host::Ok{};
  }
  return Error{fmt::format("{}: expected a number", f)};
}

template <std::size_t N>
bool one_of(std::string_view k, const std::array<std::string_view, N>& names) {
  return std::find(names.begin(), names.end(), k) != names.end();
}

host::Status memory(dom::element e, const std::string& f, proto::ContainerResources& r) {
  dom::object o;
  if (e.is_null()) return host::Ok{};
  if (e.get_object().get(o)) return Error{fmt::format("{}: expected an object", f)};
  static constexpr std::array<std::string_view, 8> kIgnored = {
      "reservation", "swap", "kernel", "kernelTCP", "swappiness", "disableOOMKiller", "useHierarchy", "checkBeforeUpdate"};
  for (auto [k, v] : o) {
    const std::string kf = fmt::format("{}.{}", f, std::string_view(k));
    if (k == "limit") {
      auto l = limit(v, kf, "bytes");
      if (!l) return l.error();
      if (*l) r.memory_max = **l;
    } else if (one_of(k, kIgnored)) {
      if (auto s = number_or_null(v, kf); !s) return s;
    } else {
      return Error{fmt::format("{}: unknown resource field", kf)};
    }
  }
  return host::Ok{};
}

host::Status cpu(dom::element e, const std::string& f, proto::ContainerResources& r) {
  dom::object o;
  if (e.is_null()) return host::Ok{};
  if (e.get_object().get(o)) return Error{fmt::format("{}: expected an object", f)};
  static constexpr std::array<std::string_view, 5> kIgnored = {"cpus", "mems", "realtimeRuntime", "realtimePeriod", "idle"};
  for (auto [k, v] : o) {
    const std::string kf = fmt::format("{}.{}", f, std::string_view(k));
    if (k == "quota") {
      auto l = limit(v, kf, "µs", proto::kCpuQuotaMin);
      if (!l) return l.error();
      if (*l) r.cpu_quota = **l;
    } else if (k == "period" || k == "shares") {
      std::uint64_t x = 0;
      std::int64_t neg = 0;
      if (v.is_null()) continue;
      if (!v.get_int64().get(neg) && neg < 0)
        return Error{fmt::format("{}: expected an unsigned integer, got {}", kf, neg)};
      if (v.get_uint64().get(x)) return Error{fmt::format("{}: expected an unsigned integer", kf)};
      if (x == 0) continue;
      if (k == "shares") {
        r.cpu_weight = shares_to_weight(x);
      } else {
        if (x < proto::kCpuPeriodMin || x > proto::kCpuPeriodMax)
          return Error{fmt::format("{}: {} is out of range ({}..{} µs)", kf, x, proto::kCpuPeriodMin, proto::kCpuPeriodMax)};
        r.cpu_period = x;
      }
    } else if (one_of(k, kIgnored)) {
      if (auto s = number_or_null(v, kf); !s) return s;
    } else {
      return Error{fmt::format("{}: unknown resource field", kf)};
    }
  }
  return host::Ok{};
}

}  // namespace

std::uint32_t shares_to_weight(std::uint64_t shares) {
  shares = std::clamp<std::uint64_t>(shares, 2, 262144);
  return static_cast<std::uint32_t>(1 + ((shares - 2) * 9999) / 262142);
}

Result<Out> parse_resources(dom::element e, std::string_view field) {
  if (e.is_null()) return Out{};
  dom::object o;
  if (e.get_object().get(o)) return Error{fmt::format("{}: expected an object", field)};
  static constexpr std::array<std::string_view, 5> kIgnored = {"devices", "blockIO", "hugepageLimits", "network", "rdma"};
  proto::ContainerResources r;
  for (auto [k, v] : o) {
    const std::string kf = fmt::format("{}.{}", field, std::string_view(k));
    if (k == "memory") {
      if (auto s = memory(v, kf, r); !s) return s.error();
    } else if (k == "cpu") {
      if (auto s = cpu(v, kf, r); !s) return s.error();
    } else if (k == "pids") {
      dom::object p;
      if (v.is_null()) continue;
      if (v.get_object().get(p)) return Error{fmt::format("{}: expected an object", kf)};
      for (auto [pk, pv] : p) {
        const std::string pf = fmt::format("{}.{}", kf, std::string_view(pk));
        if (pk != "limit") return Error{fmt::format("{}: unknown resource field", pf)};
        // runc: 0 or -1 is no limit.
        std::int64_t x = 0;
        if (pv.is_null()) continue;
        if (pv.get_int64().get(x)) return Error{fmt::format("{}: expected an integer (> 0, or -1 for no limit)", pf)};
        if (x < -1) return Error{fmt::format("{}: expected > 0, or -1 for no limit, got {}", pf, x)};
        if (static_cast<std::uint64_t>(x) > proto::kResourceMax && x > 0)
          return Error{fmt::format("{}: {} is out of range", pf, x)};
        r.pids_max = x <= 0 ? 0 : static_cast<std::uint64_t>(x);
      }
    } else if (k == "unified") {
      dom::object u;
      if (v.is_null()) continue;
      if (v.get_object().get(u)) return Error{fmt::format("{}: expected an object", kf)};
      for (auto [uk, uv] : u)
        return Error{fmt::format("{}.{}: not supported for a container in the pod's VM (use memory, cpu, pids)", kf,
                                 std::string_view(uk))};
    } else if (!one_of(k, kIgnored)) {
      return Error{fmt::format("{}: unknown resource field", kf)};
    }
  }
  if (r == proto::ContainerResources{}) return Out{};
  return Out{r};
}

Result<Out> parse_resources_json(std::string_view json, std::string_view field) {
  dom::parser p;
  dom::element e;
  if (p.parse(simdjson::padded_string(json)).get(e)) return Error{fmt::format("{}: not a JSON object", field)};
  return parse_resources(e, field);
}

proto::ContainerResources merged(const std::optional<proto::ContainerResources>& now,
                                 const proto::ContainerResources& u) {
  proto::ContainerResources r = now.value_or(proto::ContainerResources{});
  if (u.memory_max) r.memory_max = u.memory_max;
  if (u.cpu_quota) r.cpu_quota = u.cpu_quota;
  if (u.cpu_period) r.cpu_period = u.cpu_period;
  if (u.cpu_weight) r.cpu_weight = u.cpu_weight;
  if (u.pids_max) r.pids_max = u.pids_max;
  return r;
}

host::Status fits_vm(const std::vector<proto::ContainerResources>& limits, std::uint32_t mem_mib, std::uint32_t cpus) {
  std::uint64_t mem = 0;
  double cpu = 0;
  for (const auto& l : limits) {
    if (l.memory_max && *l.memory_max) mem += *l.memory_max;
    if (l.cpu_quota && *l.cpu_quota) cpu += static_cast<double>(*l.cpu_quota) / static_cast<double>(l.cpu_period.value_or(100000));
  }
  const std::uint64_t vm_mem = static_cast<std::uint64_t>(mem_mib) << 20;
  if (mem > vm_mem)
    return Error{fmt::format("linux.resources.memory.limit: the pod's containers' memory limits would add up to {} MiB, "
                             "beyond its VM's {} MiB; a pod's VM does not grow after it boots (no memory hot-plug in "
                             "the guest): not changed (recreate the pod with the larger request)",
                             (mem + (1u << 20) - 1) >> 20, mem_mib)};
  if (cpu > static_cast<double>(cpus) + 1e-9)
    return Error{fmt::format("linux.resources.cpu.quota: the pod's containers' CPU quotas would add up to {:.2f} CPUs, "
                             "beyond its VM's {} vCPUs; a pod's VM does not grow after it boots (no CPU hot-plug in "
                             "the guest): not changed (recreate the pod with the larger request)",
                             cpu, cpus)};
  return host::Ok{};
}

}  // namespace nes::shim
