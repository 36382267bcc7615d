// A task's place in its pod (host/shim/pod.hpp).
#include "host/shim/pod.hpp"

#include <optional>

#include <fmt/format.h>
#include <simdjson.h>

#include "host/shim/identity.hpp"

namespace nes::shim {
using host::Error;
using host::Result;
namespace dom = simdjson::dom;

namespace {

constexpr std::size_t kMaxSpecBytes = 4u << 20;

Error pod_error(std::string_view task_id, std::string_view field, std::string_view what) {
  return Error{fmt::format("container '{}': {}{}: {}", task_id, field.empty() ? "" : "annotations.", field, what)};
}

// One string annotation: nullopt when absent; an error when present and not a string.
Result<std::optional<std::string>> annotation(dom::object a, std::string_view key, std::string_view task_id) {
  dom::element v;
  if (a.at_key(key).get(v)) return std::optional<std::string>{};
  std::string_view s;
  if (v.get_string().get(s)) return pod_error(task_id, key, "expected a string");
  return std::optional<std::string>{std::string(s)};
}

// config.json's `annotations` object for task `task_id`, parsed into `text` with `parser` (the
// object lives as long as both); nullopt when the spec has none. At most kMaxSpecBytes. Errors
// name the container and the field.
Result<std::optional<dom::object>> annotations_of(std::string_view config_json, std::string_view task_id,
                                                  dom::parser& parser, simdjson::padded_string& text) {
  if (config_json.size() > kMaxSpecBytes)
    return Error{fmt::format("container '{}': config.json: larger than {} bytes", task_id, kMaxSpecBytes)};
  text = simdjson::padded_string(config_json);
  dom::element root;
  if (auto err = parser.parse(text).get(root); err)
    return Error{fmt::format("container '{}': config.json: {}", task_id, simdjson::error_message(err))};
  dom::object top;
  if (root.get_object().get(top)) return Error{fmt::format("container '{}': config.json: expected an object", task_id)};
  dom::element ae;
  if (top.at_key("annotations").get(ae)) return std::optional<dom::object>{};
  dom::object a;
  if (ae.get_object().get(a)) return Error{fmt::format("container '{}': annotations: expected an object of strings", task_id)};
  return std::optional<dom::object>{a};
}

}  // namespace

Result<PodPlacement> parse_pod_placement(std::string_view config_json, std::string_view task_id) {
  dom::parser parser;
  simdjson::padded_string text;
  auto ann = annotations_of(config_json, task_id, parser, text);
  if (!ann) return ann.error();
  if (!*ann) return PodPlacement{};
  const dom::object a = **ann;
  auto type = annotation(a, kContainerTypeAnnotation, task_id);
  if (!type) return type.error();
  auto sandbox = annotation(a, kSandboxIdAnnotation, task_id);
  if (!sandbox) return sandbox.error();
  if (!*type && !*sandbox) return PodPlacement{};
  if (!*type)
    return pod_error(task_id, kContainerTypeAnnotation, fmt::format("missing (sandbox-id is '{}')", **sandbox));
  PodPlacement p;
  if (**type == "sandbox") {
    p.role = PodRole::sandbox;
  } else if (**type == "container") {
    p.role = PodRole::container;
  } else {
    return pod_error(task_id, kContainerTypeAnnotation, fmt::format("'{}' is neither 'sandbox' nor 'container'", **type));
  }
  if (!*sandbox)
    return pod_error(task_id, kSandboxIdAnnotation, fmt::format("missing (container-type is '{}')", **type));
  if ((*sandbox)->empty()) return pod_error(task_id, kSandboxIdAnnotation, "empty");
  p.sandbox_id = **sandbox;
  if (p.role == PodRole::sandbox && p.sandbox_id != task_id)
    return pod_error(task_id, kSandboxIdAnnotation,
                     fmt::format("'{}' is not this sandbox's own id (a second sandbox in pod '{}'?)", p.sandbox_id, p.sandbox_id));
  if (p.role == PodRole::container && p.sandbox_id == task_id)
    return pod_error(task_id, kSandboxIdAnnotation, "names the container itself, but container-type is 'container'");
  return p;
}

namespace {
// A decimal annotation (CRI writes them with strconv): nullopt when absent.
Result<std::optional<std::int64_t>> number(dom::object a, std::string_view key, std::string_view task_id,
                                           std::string_view unit) {
  auto s = annotation(a, key, task_id);
  if (!s) return s.error();
  if (!*s) return std::optional<std::int64_t>{};
  const std::string& t = **s;
  std::int64_t v = 0;
  bool neg = !t.empty() && t[0] == '-';
  std::size_t i = neg ? 1 : 0;
  if (i == t.size() || t.size() > 18) return pod_error(task_id, key, fmt::format("expected a decimal number of {}, got '{}'", unit, t));
  for (; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') return pod_error(task_id, key, fmt::format("expected a decimal number of {}, got '{}'", unit, t));
    v = v * 10 + (t[i] - '0');
  }
  return std::optional<std::int64_t>{neg ? -v : v};
}
}  // namespace

Result<PodSize> parse_pod_size(std::string_view config_json, std::string_view task_id) {
  dom::parser parser;
  simdjson::padded_string text;
  auto ann = annotations_of(config_json, task_id, parser, text);
  if (!ann) return ann.error();
  PodSize size;
  if (!*ann) return size;
  const dom::object a = **ann;
  auto mem = number(a, kSandboxMemoryAnnotation, task_id, "bytes");
  if (!mem) return mem.error();
  auto quota = number(a, kSandboxCpuQuotaAnnotation, task_id, "microseconds");
  if (!quota) return quota.error();
  auto period = number(a, kSandboxCpuPeriodAnnotation, task_id, "microseconds");
  if (!period) return period.error();
  if (*mem && **mem < 0) return pod_error(task_id, kSandboxMemoryAnnotation, fmt::format("{} is negative", **mem));
  if (*mem && **mem > 0) {
    const std::int64_t mib = (**mem + (1 << 20) - 1) >> 20;
    if (mib > kPodMaxMemMib - kPodBaseMemMib)
      return pod_error(task_id, kSandboxMemoryAnnotation,
                       fmt::format("{} bytes: more than the VM's {} MiB", **mem, kPodMaxMemMib));
    size.mem_mib = kPodBaseMemMib + static_cast<std::uint32_t>(mib);
  }
  if (*quota && **quota > 0) {
    if (!*period || **period <= 0)
      return pod_error(task_id, kSandboxCpuPeriodAnnotation, fmt::format("missing or not positive with a quota of {}", **quota));
    const std::int64_t cpus = (**quota + **period - 1) / **period;
    if (cpus > kPodMaxCpus - kPodBaseCpus)
      return pod_error(task_id, kSandboxCpuQuotaAnnotation,
                       fmt::format("{} / {}: more than the VM's {} vCPUs", **quota, **period, kPodMaxCpus));
    size.cpus = kPodBaseCpus + static_cast<std::uint32_t>(cpus);
  }
  return size;
}

std::string_view shim_key(const PodPlacement& p, std::string_view task_id) {
  return p.role == PodRole::none ? task_id : std::string_view(p.sandbox_id);
}

Result<StartPlan> plan_start(const PodPlacement& p, std::string_view task_id, std::string_view address,
                             std::string_view ns, bool key_shim_alive) {
  StartPlan plan{!key_shim_alive, socket_path(address, ns, shim_key(p, task_id))};
  if (p.role == PodRole::container && !key_shim_alive)
    return pod_error(task_id, kSandboxIdAnnotation,
                     fmt::format("sandbox '{}' has no running shim (unknown or gone)", p.sandbox_id));
  return plan;
}

}  // namespace nes::shim
