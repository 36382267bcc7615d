// A task's place in its pod (host/shim/pod.hpp): the CRI's annotations as containerd 1.6 writes
// them into config.json, which shim serves the task, and every disagreement a clear error naming
// the container and the annotation.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include <fmt/format.h>

#include "host/shim/identity.hpp"
#include "host/shim/pod.hpp"

using namespace nes;
using shim::PodPlacement;
using shim::PodRole;

namespace {

constexpr std::string_view kAddress = "/run/containerd/containerd.sock";
const std::string kSandbox = "5f2a9c";  // a sandbox id (containerd's are 64 hex digits)

// config.json with these annotations (a JSON object's members, already quoted), as the CRI
// plugin writes them beside its others.
std::string spec(std::string_view members) {
  return fmt::format(R"({{"ociVersion": "1.0.2-dev", "process": {{"args": ["/pause"]}},
    "annotations": {{"io.kubernetes.cri.sandbox-name": "web", "io.kubernetes.cri.sandbox-namespace": "default"{}{}}}}})",
                     members.empty() ? "" : ", ", members);
}

std::string error_of(std::string_view json, std::string_view id) {
  auto r = shim::parse_pod_placement(json, id);
  REQUIRE_FALSE(r);
  return r.error().message;
}

}  // namespace

TEST_CASE("no CRI annotations: a task of its own, its own shim") {
  auto none = shim::parse_pod_placement(R"({"process": {"args": ["/bin/true"]}})", "t1");
  REQUIRE(none);
  CHECK(*none == PodPlacement{});
  CHECK(shim::shim_key(*none, "t1") == "t1");
  auto others = shim::parse_pod_placement(spec(""), "t1");  // other annotations only
  REQUIRE(others);
  CHECK(others->role == PodRole::none);
}

TEST_CASE("the sandbox and a container of one pod are served by the sandbox's shim") {
  auto sb = shim::parse_pod_placement(
      spec(fmt::format(R"("io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "{}")", kSandbox)),
      kSandbox);
  REQUIRE(sb);
  CHECK(*sb == PodPlacement{PodRole::sandbox, kSandbox});
  auto c = shim::parse_pod_placement(
      spec(fmt::format(R"("io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "{}")", kSandbox)),
      "c1");
  REQUIRE(c);
  CHECK(*c == PodPlacement{PodRole::container, kSandbox});
  CHECK(shim::shim_key(*c, "c1") == kSandbox);
  CHECK(shim::shim_key(*sb, kSandbox) == kSandbox);

  // shim start: the sandbox spawns its shim on its own socket; the container answers that one.
  auto sp = shim::plan_start(*sb, kSandbox, kAddress, "k8s.io", false);
  REQUIRE(sp);
  CHECK(sp->spawn);
  CHECK(sp->socket == shim::socket_path(kAddress, "k8s.io", kSandbox));
  auto cp = shim::plan_start(*c, "c1", kAddress, "k8s.io", true);
  REQUIRE(cp);
  CHECK_FALSE(cp->spawn);
  CHECK(cp->socket == sp->socket);
  // The sandbox asked twice (containerd's retry): its live shim answered again.
  auto again = shim::plan_start(*sb, kSandbox, kAddress, "k8s.io", true);
  REQUIRE(again);
  CHECK(*again == shim::StartPlan{false, sp->socket});
  // Another namespace or daemon: another shim.
  CHECK(shim::plan_start(*c, "c1", kAddress, "other", true)->socket != sp->socket);
  // A plain task: its own socket, as before pods.
  auto plain = shim::plan_start(PodPlacement{}, "t1", kAddress, "default", false);
  REQUIRE(plain);
  CHECK(*plain == shim::StartPlan{true, shim::socket_path(kAddress, "default", "t1")});
}

TEST_CASE("a container whose sandbox is unknown or gone: an error naming both") {
  PodPlacement c{PodRole::container, kSandbox};
  auto r = shim::plan_start(c, "c1", kAddress, "k8s.io", false);
  REQUIRE_FALSE(r);
  CHECK(r.error().message ==
        "container 'c1': annotations.io.kubernetes.cri.sandbox-id: sandbox '5f2a9c' has no running shim (unknown or gone)");
}

TEST_CASE("annotations that disagree: errors naming the container and the field") {
  const std::string ct = "\"io.kubernetes.cri.container-type\"", sid = "\"io.kubernetes.cri.sandbox-id\"";
  // A second sandbox in one pod: a sandbox task whose sandbox-id is another's.
  CHECK(error_of(spec(fmt::format(R"({}: "sandbox", {}: "{}")", ct, sid, kSandbox)), "other") ==
        "container 'other': annotations.io.kubernetes.cri.sandbox-id: '5f2a9c' is not this sandbox's own id "
        "(a second sandbox in pod '5f2a9c'?)");
  CHECK(error_of(spec(fmt::format(R"({}: "container", {}: "c1")", ct, sid)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.sandbox-id: names the container itself, but container-type is "
        "'container'");
  CHECK(error_of(spec(fmt::format(R"({}: "container")", ct)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.sandbox-id: missing (container-type is 'container')");
  CHECK(error_of(spec(fmt::format(R"({}: "{}")", sid, kSandbox)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.container-type: missing (sandbox-id is '5f2a9c')");
  CHECK(error_of(spec(fmt::format(R"({}: "pod", {}: "{}")", ct, sid, kSandbox)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.container-type: 'pod' is neither 'sandbox' nor 'container'");
  CHECK(error_of(spec(fmt::format(R"({}: "container", {}: "")", ct, sid)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.sandbox-id: empty");
  CHECK(error_of(spec(fmt::format(R"({}: 7, {}: "{}")", ct, sid, kSandbox)), "c1") ==
        "container 'c1': annotations.io.kubernetes.cri.container-type: expected a string");
  CHECK(error_of(R"({"annotations": ["a"]})", "c1") == "container 'c1': annotations: expected an object of strings");
  CHECK(error_of("{", "c1").starts_with("container 'c1': config.json: "));
  CHECK(error_of(std::string((4u << 20) + 1, ' '), "c1") == "container 'c1': config.json: larger than 4194304 bytes");
}

TEST_CASE("the pod VM's size: CRI's sandbox annotations added to the VM's defaults, as Kata sizes a pod VM") {
  auto size = [](const std::string& annotations) {
    return shim::parse_pod_size(R"({"annotations": {)" + annotations + "}}", "s1");
  };
  CHECK(*shim::parse_pod_size(R"({"process": {}})", "s1") == shim::PodSize{256, 1});
  CHECK(*size("") == shim::PodSize{256, 1});
  // 100 MiB + 1 byte rounds up to 101 MiB; 1.5 CPUs (150000/100000) to 2 vCPUs.
  CHECK(*size(R"("io.kubernetes.cri.sandbox-memory": "104857601", "io.kubernetes.cri.sandbox-cpu-quota": "150000",
                  "io.kubernetes.cri.sandbox-cpu-period": "100000")") == shim::PodSize{357, 3});
  // CRI writes 0 (and a quota of -1) when the kubelet sent no limit: the defaults.
  CHECK(*size(R"("io.kubernetes.cri.sandbox-memory": "0", "io.kubernetes.cri.sandbox-cpu-quota": "-1",
                  "io.kubernetes.cri.sandbox-cpu-period": "0")") == shim::PodSize{256, 1});
  auto bad = size(R"("io.kubernetes.cri.sandbox-memory": "1G")");
  REQUIRE(!bad);
  CHECK(bad.error().message == "container 's1': annotations.io.kubernetes.cri.sandbox-memory: expected a decimal number of bytes, got '1G'");
  bad = size(R"("io.kubernetes.cri.sandbox-cpu-quota": "50000")");
  REQUIRE(!bad);
  CHECK(bad.error().message.starts_with("container 's1': annotations.io.kubernetes.cri.sandbox-cpu-period: missing"));
  bad = size(R"("io.kubernetes.cri.sandbox-cpu-quota": "10000000", "io.kubernetes.cri.sandbox-cpu-period": "100000")");
  REQUIRE(!bad);
  CHECK(bad.error().message.find("more than the VM's 64 vCPUs") != std::string::npos);
  bad = size(R"("io.kubernetes.cri.sandbox-memory": 5)");
  REQUIRE(!bad);
  CHECK(bad.error().message == "container 's1': annotations.io.kubernetes.cri.sandbox-memory: expected a string");
}
