// config.json -> TaskSpec: what containerd's default spec (ctr run) gives becomes the task; what a
// microVM cannot honour is an error naming the field; the `neshost run` command line; the names
// derived from (namespace, id).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "host/lib/record.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/oci_spec.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/sha256.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;

namespace {

// The shape `ctr run --rootfs DIR t1 /bin/sh -c 'echo hi'` writes (containerd 1.6 oci defaults),
// trimmed to the fields that matter plus a few that must be ignored.
constexpr std::string_view kCtrSpec = R"({
  "ociVersion": "1.0.2-dev",
  "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0, 10]},
              "args": ["/bin/sh", "-c", "echo hi"], "env": ["PATH=/bin", "A=b=c"], "cwd": "/",
              "capabilities": {"bounding": ["CAP_CHOWN"]}, "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
              "noNewPrivileges": true},
  "root": {"path": "rootfs"},
  "hostname": "box",
  "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
             {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
             {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
             {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]},
             {"destination": "/data", "type": "bind", "source": "/tmp", "options": ["rbind", "ro"]}],
  "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"]}
})";

}  // namespace

TEST_CASE("ctr's default spec becomes the task; in-kernel confinement is ignored") {
  auto s = shim::parse_oci_spec(kCtrSpec, "/b/t1");
  REQUIRE_MESSAGE(s, (s ? "" : s.error().message));
  CHECK(s->argv == std::vector<std::string>{"/bin/sh", "-c", "echo hi"});
  CHECK(s->env == std::vector<std::string>{"PATH=/bin", "A=b=c"});
  CHECK(s->root == "/b/t1/rootfs");
  CHECK(s->hostname == "box");
  CHECK(s->groups == std::vector<std::uint32_t>{0, 10});
  REQUIRE(s->volumes.size() == 1);
  CHECK(s->volumes[0] == shim::Volume{.host = std::filesystem::canonical("/tmp"), .guest = "/data", .ro = true, .rbind = true});
  auto a = shim::run_args(*s, {"ctr-x", "/st", true});
  std::vector<std::string> want = {"run", "--vmm-outlives", "--vm", "ctr-x", "--state", "/st", "--rootfs", "/b/t1/rootfs", "--user", "0:0",
                                   "--workdir", "/", "--group-add", "10", "--hostname", "box", "--env", "PATH=/bin",
                                   "--env", "A=b=c", "--volume", std::filesystem::canonical("/tmp").string() + ":/data:ro", "--interactive", "--stdin-hold", "--",
                                   "/bin/sh", "-c", "echo hi"};
  CHECK(a == want);
}

TEST_CASE("what a microVM cannot honour is refused, naming the field") {
  struct Bad {
    std::string json, field;
  };
  const std::string ok_process = R"("process": {"args": ["/bin/true"]}, "root": {"path": "/r"})";
  for (const Bad& b : std::vector<Bad>{
           {R"({"root": {"path": "/r"}})", "process"},
           {R"({"process": {"args": []}, "root": {"path": "/r"}})", "process.args"},
           {R"({"process": {"args": [1]}, "root": {"path": "/r"}})", "process.args[0]"},
           {R"({"process": {"args": ["x"], "env": ["NOEQ"]}, "root": {"path": "/r"}})", "process.env[0]"},
           {R"({"process": {"args": ["x"], "cwd": "rel"}, "root": {"path": "/r"}})", "process.cwd"},
           {R"({"process": {"args": ["x"], "user": {"uid": -1}}, "root": {"path": "/r"}})", "process.user.uid"},
           {R"({"process": {"args": ["x"], "user": {"username": "bob"}}, "root": {"path": "/r"}})", "process.user.username"},
           {R"({"process": {"args": ["x"]}})", "root"},
           {"{" + ok_process + R"(, "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}}})", "linux.seccomp"},
           {"{" + ok_process + R"(, "linux": {"devices": [{"path": "/dev/fuse", "type": "c"}]}})", "linux.devices"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/x", "type": "nfs", "source": "h:/e"}]})", "mounts[0].type"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/x", "type": "bind", "source": "rel"}]})", "mounts[0].source"},
           // A bind of something neither a directory nor a regular file (a character device).
           {"{" + ok_process + R"(, "mounts": [{"destination": "/x", "type": "bind", "source": "/dev/null"}]})", "mounts[0].source"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/a:b", "type": "bind", "source": "/tmp"}]})", "mounts[0]"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/x", "type": "bind", "source": "/tmp"},
                                               {"destination": "/x", "type": "bind", "source": "/"}]})", "mounts[1].destination"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["huge=always"]}]})", "mounts[0].options"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["size=x"]}]})", "mounts[0].options"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/s/../x", "type": "tmpfs", "source": "tmpfs"}]})", "mounts[0].destination"},
           {"{" + ok_process + R"(, "mounts": [{"destination": "/n", "type": "nfs", "source": "h:/x"}]})", "mounts[0].type"},
           {R"({"process": {"args": ["x"], "user": {"uid": 4294967295}}, "root": {"path": "/r"}})", "process.user"},
           {"{" + ok_process + R"(, "annotations": {"io.nesinit.snapshot": "rel/dir"}})", "annotations.io.nesinit.snapshot"},
           {"{" + ok_process + R"(, "annotations": {"io.nesinit.snapshot": 1}})", "annotations.io.nesinit.snapshot"},
           {"[1]", "expected a JSON object"},
           {"{", "config.json"},
       }) {
    auto s = shim::parse_oci_spec(b.json, "/b");
    REQUIRE_MESSAGE(!s, b.json);
    CHECK_MESSAGE(s.error().message.find(b.field) != std::string::npos, s.error().message, " / want ", b.field);
  }
}

TEST_CASE("CRI's single-file binds (/etc/hosts, /dev/termination-log) become file volumes") {
  nes::test::TempDir d;
  std::ofstream(d.path / "etc-hosts") << "127.0.0.1 localhost\n";
  std::ofstream(d.path / "termination-log");
  const std::string json = R"({"process": {"args": ["/bin/true"]}, "root": {"path": "/r"}, "mounts": [
      {"destination": "/etc/hosts", "type": "bind", "source": ")" + (d.path / "etc-hosts").string() +
                           R"(", "options": ["rbind", "rprivate", "ro"]},
      {"destination": "/dev/termination-log", "type": "bind", "source": ")" +
                           (d.path / "termination-log").string() + R"(", "options": ["rbind", "rw"]}]})";
  auto s = shim::parse_oci_spec(json, "/b");
  REQUIRE_MESSAGE(s, s.error().message);
  REQUIRE(s->volumes.size() == 2);
  CHECK(s->volumes[0] == shim::Volume{.host = std::filesystem::canonical(d.path / "etc-hosts"), .guest = "/etc/hosts",
                                      .ro = true, .rbind = true, .propagation = "rprivate"});
  CHECK(s->volumes[1] == shim::Volume{.host = std::filesystem::canonical(d.path / "termination-log"),
                                      .guest = "/dev/termination-log", .rbind = true});
}

TEST_CASE("a tmpfs where the guest mounts none, and a bind's options, are kept for a pod's container") {
  nes::test::TempDir d;
  const std::string json = R"({"process": {"args": ["/bin/true"]}, "root": {"path": "/r"}, "mounts": [
      {"destination": "/cache", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=16m", "mode=1777"]},
      {"destination": "/v", "type": "bind", "source": ")" + d.path.string() + R"(", "options": ["bind", "nosuid", "noexec", "rslave"]}]})";
  auto s = shim::parse_oci_spec(json, "/b");
  REQUIRE_MESSAGE(s, s.error().message);
  REQUIRE(s->tmpfs.size() == 1);
  CHECK(s->tmpfs[0] == shim::Tmpfs{"/cache", false, true, true, false, "size=16m,mode=1777", "mounts[0]"});
  REQUIRE(s->volumes.size() == 1);
  CHECK(s->volumes[0] == shim::Volume{.host = std::filesystem::canonical(d.path), .guest = "/v", .nosuid = true,
                                      .noexec = true, .propagation = "rslave"});
}

TEST_CASE("CRI's bind of the pod's shm directory over /dev/shm is met by the guest's own /dev/shm") {
  nes::test::TempDir d;
  std::filesystem::create_directory(d.path / "shm");
  const std::string json = R"({"process": {"args": ["/pause"]}, "root": {"path": "/r"}, "mounts": [
      {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777"]},
      {"destination": "/dev/shm", "type": "bind", "source": ")" + (d.path / "shm").string() +
                           R"(", "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}]})";
  auto s = shim::parse_oci_spec(json, "/b");
  REQUIRE_MESSAGE(s, s.error().message);
  CHECK(s->volumes.empty());
}

TEST_CASE("a bundle without config.json is an error naming the file") {
  auto s = shim::read_oci_config("/nonexistent-bundle");
  REQUIRE(!s);
  CHECK(s.error().message.find("/nonexistent-bundle/config.json") != std::string::npos);
}

TEST_CASE("names from (namespace, id): length-framed, valid VM ids, stable") {
  // SHA-256 of the framing itself, checked against an independent computation:
  // printf '\0\0\0\0\0\0\0\1a' | sha256sum
  CHECK(shim::framed_sha256({"a"}) == "3b196fd4907bedf51c3090e9835f2f7cb61e7ee1b2299ea3b8fed9b4183a822a");
  // hex() a second time: the same digest (not a second EVP_DigestFinal_ex), and update() after it
  // changes nothing.
  vm::Sha256 sha;
  REQUIRE(sha.ok());
  sha.update("abc");
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  CHECK(sha.hex() == abc);
  CHECK(sha.hex() == abc);
  sha.update("more");
  CHECK(sha.hex() == abc);
  CHECK(shim::vm_id("default", "t1") == shim::vm_id("default", "t1"));
  CHECK(shim::vm_id("a/b", "c") != shim::vm_id("a", "b/c"));
  CHECK(shim::vm_id("ab", "c") != shim::vm_id("a", "bc"));
  CHECK(host::check_vm_id(shim::vm_id("k8s.io", std::string(200, 'x'))));
  CHECK(shim::vm_id("default", "t1").size() == 28);
  // Each incarnation its own VM id: valid, 45 bytes, the task's stem, never repeated.
  const std::string a = shim::new_incarnation(), b = shim::new_incarnation();
  CHECK(a.size() == 16);
  CHECK(a != b);
  const std::string va = shim::incarnation_vm_id("k8s.io", std::string(200, 'x'), a);
  CHECK(host::check_vm_id(va));
  CHECK(va.size() == 45);
  CHECK(va.starts_with(shim::vm_id("k8s.io", std::string(200, 'x')) + "-"));
  CHECK(va != shim::incarnation_vm_id("k8s.io", std::string(200, 'x'), b));
  CHECK(shim::socket_path("/run/containerd/containerd.sock", "default", "t1").parent_path() == "/run/containerd/s");
  CHECK(shim::socket_path("/tmp/x/c.sock", "default", "t1").parent_path() == "/tmp/x/s");
}

TEST_CASE("linux.namespaces: a network namespace with a path is netns mode; without one, the default") {
  auto with = [](std::string_view namespaces) {
    std::string j(kCtrSpec);
    const std::string_view old = R"("namespaces": [{"type": "pid"}, {"type": "mount"}])";
    j.replace(j.find(old), old.size(), std::string(R"("namespaces": )") + std::string(namespaces));
    return shim::parse_oci_spec(j, "/b/t1");
  };
  auto cni = with(R"([{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1234"}, {"type": "mount"}])");
  REQUIRE_MESSAGE(cni, (cni ? "" : cni.error().message));
  CHECK(cni->netns == "/var/run/netns/cni-1234");
  auto a = shim::run_args(*cni, {"ctr-x", "/st", false});
  auto at = std::find(a.begin(), a.end(), "--network");
  REQUIRE(at != a.end());
  REQUIRE(at + 1 != a.end());
  CHECK(*(at + 1) == "netns:/var/run/netns/cni-1234");
  CHECK(at < std::find(a.begin(), a.end(), "--"));

  // A network namespace of its own (no path), or none named: neshost run's default network.
  for (auto ns : {R"([{"type": "network"}])", R"([{"type": "pid"}])", R"([])"}) {
    auto s = with(ns);
    REQUIRE_MESSAGE(s, (s ? "" : s.error().message));
    CHECK(s->netns.empty());
    auto args = shim::run_args(*s, {"ctr-x", "/st", false});
    CHECK(std::find(args.begin(), args.end(), "--network") == args.end());
  }

  struct Bad {
    std::string namespaces, error;
  };
  for (const auto& b : std::vector<Bad>{
           {R"({"type": "network"})", "config.json: linux.namespaces: expected an array"},
           {R"([{"type": "network", "path": "netns/x"}])", "config.json: linux.namespaces[0].path: expected an absolute path"},
           {R"([{"path": "/x"}])", "config.json: linux.namespaces[0].type: expected a string"},
           {R"([{"type": "network", "path": "/a"}, {"type": "network", "path": "/b"}])",
            "config.json: linux.namespaces[1]: a second network namespace"},
       }) {
    auto s = with(b.namespaces);
    INFO(b.namespaces);
    REQUIRE(!s);
    CHECK(s.error().message == b.error);
  }
}

TEST_CASE("io.nesinit.snapshot: the task's VM restored from that snapshot (--snapshot DIR)") {
  auto s = shim::parse_oci_spec(
      R"({"process": {"args": ["/bin/true"]}, "root": {"path": "/r"},
          "annotations": {"io.nesinit.snapshot": "/var/lib/neshost/.snapshots/warm", "other": "x"}})", "/b");
  REQUIRE(s);
  CHECK(s->snapshot == "/var/lib/neshost/.snapshots/warm");
  auto a = shim::run_args(*s, {"ctr-x", "/st", false});
  auto at = std::find(a.begin(), a.end(), "--snapshot");
  REQUIRE(at != a.end());
  CHECK(*(at + 1) == "/var/lib/neshost/.snapshots/warm");
  CHECK(std::find(a.begin(), at, "--") == at);  // an option, before ARGV
  auto none = shim::parse_oci_spec(R"({"process": {"args": ["/bin/true"]}, "root": {"path": "/r"}})", "/b");
  REQUIRE(none);
  auto b = shim::run_args(*none, {"ctr-x", "/st", false});
  CHECK(std::find(b.begin(), b.end(), "--snapshot") == b.end());
}

namespace {
// $NESHOST_NETWORK as the shim's `neshost run` would inherit it, for one scope; restored after.
struct NetworkEnv {
  std::optional<std::string> saved;
  explicit NetworkEnv(const char* v) {
    if (const char* e = std::getenv("NESHOST_NETWORK")) saved = e;
    if (v) ::setenv("NESHOST_NETWORK", v, 1);
    else ::unsetenv("NESHOST_NETWORK");
  }
  ~NetworkEnv() {
    if (saved) ::setenv("NESHOST_NETWORK", saved->c_str(), 1);
    else ::unsetenv("NESHOST_NETWORK");
  }
  NetworkEnv(const NetworkEnv&) = delete;
  NetworkEnv& operator=(const NetworkEnv&) = delete;
};
}  // namespace

TEST_CASE("io.nesinit.snapshot: at most kHotplugPorts shares, one fewer with a NIC (neshost run --snapshot's limit)") {
  static_assert(vm::kHotplugPorts == 8);  // the counts below
  nes::test::TempDir d;
  for (int i = 0; i < 9; ++i) std::filesystem::create_directory(d.path / fmt::format("d{}", i));
  for (int i = 0; i < 3; ++i) std::ofstream(d.path / fmt::format("f{}", i)) << "x";
  // A spec with the snapshot annotation, `dirs` directory binds, `files` file binds, and a CNI
  // network namespace if `netns`.
  auto spec = [&](int dirs, int files, bool netns, bool snapshot = true) {
    std::string mounts;
    for (int i = 0; i < dirs; ++i)
      mounts += fmt::format(R"({}{{"destination": "/v{}", "type": "bind", "source": "{}"}})", mounts.empty() ? "" : ", ", i,
                            (d.path / fmt::format("d{}", i)).string());
    for (int i = 0; i < files; ++i)
      mounts += fmt::format(R"({}{{"destination": "/etc/f{}", "type": "bind", "source": "{}"}})", mounts.empty() ? "" : ", ",
                            i, (d.path / fmt::format("f{}", i)).string());
    return shim::parse_oci_spec(
        fmt::format(R"({{"process": {{"args": ["/bin/true"]}}, "root": {{"path": "/r"}}, "mounts": [{}]{}{}}})", mounts,
                    snapshot ? R"(, "annotations": {"io.nesinit.snapshot": "/s/warm"})" : "",
                    netns ? R"(, "linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/cni-1"}]})" : ""),
        "/b");
  };
  auto refused = [](const host::Result<shim::TaskSpec>& s, std::string_view limit, std::string_view count) {
    REQUIRE(!s);
    INFO(s.error().message);
    CHECK(s.error().message.starts_with("config.json: annotations.io.nesinit.snapshot: "));
    CHECK(s.error().message.find(fmt::format("at most {} shares", limit)) != std::string::npos);
    CHECK(s.error().message.find(fmt::format("this task has {}", count)) != std::string::npos);
  };
  {
    NetworkEnv none("none");  // no NIC: 8 shares
    auto at = spec(7, 0, false);  // --rootfs and 7 volumes
    REQUIRE_MESSAGE(at, (at ? "" : at.error().message));
    const auto args = shim::run_args(*at, {"ctr-x", "/st", false});
    CHECK(std::count(args.begin(), args.end(), std::string("--volume")) == 7);
    refused(spec(8, 0, false), "8", "9");
    // The file binds share one staging share: 6 directories and 3 files are 8 shares, 7 and 3 are 9.
    auto files = spec(6, 3, false);
    REQUIRE_MESSAGE(files, (files ? "" : files.error().message));
    refused(spec(7, 3, false), "8", "9");
    // A network namespace is a NIC whatever $NESHOST_NETWORK says: 7 shares.
    refused(spec(7, 0, true), "7", "8");
    auto nic_at = spec(6, 0, true);
    REQUIRE_MESSAGE(nic_at, (nic_at ? "" : nic_at.error().message));
    // Without the annotation, only the 16 volumes' limit.
    auto plain = spec(9, 3, true, false);
    REQUIRE_MESSAGE(plain, (plain ? "" : plain.error().message));
  }
  for (const char* v : {static_cast<const char*>(nullptr), "", "user", "slirp"}) {
    NetworkEnv nic(v);  // neshost run's default network (user), or another mode with a NIC: 7 shares
    INFO("NESHOST_NETWORK=", v ? v : "(unset)");
    auto at = spec(6, 0, false);
    REQUIRE_MESSAGE(at, (at ? "" : at.error().message));
    refused(spec(7, 0, false), "7", "8");
    refused(spec(6, 1, false), "7", "8");
  }
}
