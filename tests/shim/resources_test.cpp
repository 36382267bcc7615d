// linux.resources -> a pod's container's cgroup limits (host/shim/resources.hpp): runc's cgroup v2
// conversion, what the kubelet and containerd send accepted, bad input named by its field, and
// the pod's sum against its VM.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "host/shim/resources.hpp"

using namespace nes;
using shim::parse_resources_json;

namespace {
std::string error_of(std::string_view json) {
  auto r = parse_resources_json(json, "linux.resources");
  return r ? std::string("ok") : r.error().message;
}
}  // namespace

TEST_CASE("runc's shares -> weight conversion") {
  CHECK(shim::shares_to_weight(2) == 1);
  CHECK(shim::shares_to_weight(1024) == 39);  // the kernel's default shares: weight 39, as runc gives
  CHECK(shim::shares_to_weight(262144) == 10000);
  CHECK(shim::shares_to_weight(1) == 1);          // clamped
  CHECK(shim::shares_to_weight(1u << 30) == 10000);
}

TEST_CASE("what containerd's CRI sends for a kubelet's limits becomes the cgroup's") {
  // CRI's WithResources (containerd 1.6) for limits memory 64Mi, cpu 500m: the devices rule every
  // spec has, swap = limit, hugepage limits of 0, empty cpusets.
  auto r = parse_resources_json(R"({"devices":[{"allow":false,"access":"rwm"}],
      "memory":{"limit":67108864,"swap":67108864},
      "cpu":{"shares":512,"quota":50000,"period":100000,"cpus":"","mems":""},
      "pids":{"limit":0},"hugepageLimits":[{"pageSize":"2MB","limit":0}]})", "linux.resources");
  REQUIRE(r);
  REQUIRE(*r);
  CHECK((*r)->memory_max == std::optional<std::uint64_t>(67108864));
  CHECK((*r)->cpu_quota == std::optional<std::uint64_t>(50000));
  CHECK((*r)->cpu_period == std::optional<std::uint64_t>(100000));
  CHECK((*r)->cpu_weight == std::optional<std::uint32_t>(1 + (510 * 9999) / 262142));
  CHECK((*r)->pids_max == std::optional<std::uint64_t>(0));
  // -1: no limit (the wire's 0); 0 and null: not set; nothing set: none.
  r = parse_resources_json(R"({"memory":{"limit":-1},"cpu":{"quota":-1}})", "linux.resources");
  REQUIRE(r);
  CHECK((*r)->memory_max == std::optional<std::uint64_t>(0));
  CHECK((*r)->cpu_quota == std::optional<std::uint64_t>(0));
  r = parse_resources_json(R"({"devices":[],"memory":{"limit":0},"cpu":{"shares":null}})", "linux.resources");
  REQUIRE(r);
  CHECK_FALSE(*r);
}

TEST_CASE("bad input names the field") {
  CHECK(error_of(R"({"memory":{"limit":-5}})") ==
        "linux.resources.memory.limit: expected bytes > 0, or -1 for no limit, got -5");
  CHECK(error_of(R"({"cpu":{"quota":-2}})") == "linux.resources.cpu.quota: expected µs > 0, or -1 for no limit, got -2");
  CHECK(error_of(R"({"cpu":{"quota":500}})") == "linux.resources.cpu.quota: 500 is out of range (1000..9007199254740991)");
  CHECK(error_of(R"({"cpu":{"period":-1}})") == "linux.resources.cpu.period: expected an unsigned integer, got -1");
  CHECK(error_of(R"({"cpu":{"period":5000000}})") == "linux.resources.cpu.period: 5000000 is out of range (1000..1000000 µs)");
  CHECK(error_of(R"({"cpu":{"shares":-3}})") == "linux.resources.cpu.shares: expected an unsigned integer, got -3");
  CHECK(error_of(R"({"pids":{"limit":-7}})") == "linux.resources.pids.limit: expected > 0, or -1 for no limit, got -7");
  CHECK(error_of(R"({"memory":{"limit":"64M"}})") ==
        "linux.resources.memory.limit: expected an integer (bytes > 0, or -1 for no limit)");
  CHECK(error_of(R"({"memory":{"swap":-9}})") == "linux.resources.memory.swap: expected a value >= -1, got -9");
  CHECK(error_of(R"({"memroy":{"limit":1}})") == "linux.resources.memroy: unknown resource field");
  CHECK(error_of(R"({"memory":{"lim":1}})") == "linux.resources.memory.lim: unknown resource field");
  CHECK(error_of(R"({"pids":{"max":1}})") == "linux.resources.pids.max: unknown resource field");
  CHECK(error_of(R"({"unified":{"memory.high":"1000"}})").starts_with("linux.resources.unified.memory.high: not supported"));
  CHECK(error_of(R"({"memory":7})") == "linux.resources.memory: expected an object");
  CHECK(error_of("[") == "linux.resources: not a JSON object");
}

TEST_CASE("merged and fits_vm: an Update past the pod's VM is refused naming the field and both sizes") {
  proto::ContainerResources now;
  now.memory_max = 32u << 20;
  now.cpu_weight = 10;
  proto::ContainerResources up;
  up.memory_max = 48u << 20;
  auto m = shim::merged(now, up);
  CHECK(m.memory_max == std::optional<std::uint64_t>(48u << 20));
  CHECK(m.cpu_weight == std::optional<std::uint32_t>(10));
  proto::ContainerResources other;
  other.memory_max = 200u << 20;
  other.cpu_quota = 100000;  // one CPU
  CHECK(shim::fits_vm({m, other}, 320, 2));
  m.memory_max = 200u << 20;
  auto f = shim::fits_vm({m, other}, 320, 2);
  REQUIRE_FALSE(f);
  CHECK(f.error().message.starts_with(
      "linux.resources.memory.limit: the pod's containers' memory limits would add up to 400 MiB, beyond its VM's 320 MiB"));
  m.memory_max = 0;  // no limit: not counted
  m.cpu_quota = 150000;
  m.cpu_period = 100000;
  f = shim::fits_vm({m, other}, 320, 2);
  REQUIRE_FALSE(f);
  CHECK(f.error().message.starts_with(
      "linux.resources.cpu.quota: the pod's containers' CPU quotas would add up to 2.50 CPUs, beyond its VM's 2 vCPUs"));
}
