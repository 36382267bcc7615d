// The Task service's state machine, call by call over a real ttrpc connection (a socketpair),
// with a real child in place of `neshost run` (a shell script that exits with a given code or
// sleeps until killed): Create's errors, Wait before and after the exit, Kill before Start and of a
// VM without a control socket (SIGKILL: 137), Delete while running, early waiters answered by
// Delete, Shutdown by phase, ResizePty without a terminal.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include <boost/asio/io_context.hpp>

#include "containerd_pb.h"
#include "host/shim/fault_point.hpp"
#include "host/shim/pod_mounts.hpp"
#include "host/shim/task_service.hpp"
#include "host/shim/ttrpc.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
namespace asio = boost::asio;
namespace v2 = containerd::task::v2;
namespace fs = std::filesystem;

namespace {

struct Rig {
  test::TempDir tmp{"shimtask"};
  fs::path bundle = tmp.path / "b";
  asio::io_context io;
  shim::Publisher events{"", "default"};  // no containerd: events dropped
  ttrpc::Server server{io};
  std::unique_ptr<shim::TaskService> task;
  int client = -1;
  bool shut_down = false;
  ttrpc::FrameReader reader;
  std::uint32_t next_stream = 1;

  /// `on_bundle`: a shim started again on another rig's bundle (a replacement; nothing written).
  explicit Rig(const std::string& fake_neshost_body, bool with_config = true, const fs::path& on_bundle = {}) {
    if (!on_bundle.empty()) bundle = on_bundle;
    fs::create_directories(bundle / "rootfs");
    if (with_config && on_bundle.empty()) {
      std::ofstream(bundle / "config.json")
          << R"({"process": {"args": ["/bin/true"], "cwd": "/"}, "root": {"path": "rootfs"}})";
    }
    fs::path fake = tmp.path / "neshost";
    std::ofstream(fake) << "#!/bin/sh\n" << fake_neshost_body << "\n";
    fs::permissions(fake, fs::perms::owner_all);
    shim::ServiceConfig c;
    c.ns = "default";
    c.id = "t1";
    c.bundle = bundle;
    c.neshost = fake;
    c.shutdown = [this] { shut_down = true; };
    task = std::make_unique<shim::TaskService>(io, c, events);
    task->register_on(server);
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client = sv[0];
    server.serve_connection(host::Fd(sv[1]));
  }
  ~Rig() { ::close(client); }

  std::uint32_t send(const std::string& method, const google::protobuf::Message& m) {
    std::uint32_t s = next_stream;
    next_stream += 2;
    std::string f = ttrpc::encode_frame(s, ttrpc::MsgType::request,
                                        ttrpc::encode_request({"containerd.task.v2.Task", method, m.SerializeAsString(), 0, {}}));
    REQUIRE(::write(client, f.data(), f.size()) == static_cast<ssize_t>(f.size()));
    return s;
  }
  // Runs the service until the answer on `stream` arrives (bounded: 20 s of loop turns).
  ttrpc::Reply answer(std::uint32_t stream) {
    for (int i = 0; i < 20000; ++i) {
      while (auto f = reader.next()) {
        if (f->stream == stream) {
          auto r = ttrpc::decode_response(f->payload);
          REQUIRE(r);
          return *r;
        }
        pending.push_back(std::move(*f));
      }
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (it->stream == stream) {
          auto r = ttrpc::decode_response(it->payload);
          pending.erase(it);
          REQUIRE(r);
          return *r;
        }
      io.run_for(std::chrono::milliseconds(1));
      io.restart();
      char buf[65536];
      ssize_t n = ::recv(client, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) reader.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    }
    FAIL("no answer on stream " << stream);
    return {};
  }
  ttrpc::Reply call(const std::string& method, const google::protobuf::Message& m) { return answer(send(method, m)); }
  std::vector<ttrpc::Frame> pending;

  ttrpc::Reply create(bool terminal = false) {
    v2::CreateTaskRequest r;
    r.set_id("t1");
    r.set_bundle(bundle.string());
    r.set_terminal(terminal);
    return call("Create", r);
  }
  template <class M>
  static M id_req() {
    M m;
    m.set_id("t1");
    return m;
  }
};

template <class M>
M parse(const ttrpc::Reply& r) {
  M m;
  REQUIRE(r.status.ok());
  REQUIRE(m.ParseFromString(r.payload));
  return m;
}

}  // namespace

TEST_CASE("Create without config.json: INVALID_ARGUMENT naming the file; nothing created") {
  Rig r("exit 0", false);
  auto a = r.create();
  CHECK(a.status.code == ttrpc::Code::invalid_argument);
  CHECK(a.status.message.find((r.bundle / "config.json").string()) != std::string::npos);
  CHECK(!fs::exists(r.bundle / "nesinit-task.json"));
  auto s = r.call("State", Rig::id_req<v2::StateRequest>());
  CHECK(s.status.code == ttrpc::Code::not_found);
}

TEST_CASE("Create of a task of its own with a tmpfs the guest does not mount: INVALID_ARGUMENT naming the field; nothing created") {
  Rig r("exit 0", false);
  std::ofstream(r.bundle / "config.json") << R"({"process": {"args": ["/bin/sh"], "cwd": "/"}, "root": {"path": "rootfs"},
      "mounts": [{"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}]})";
  auto a = r.create();
  CHECK(a.status.code == ttrpc::Code::invalid_argument);
  CHECK(a.status.message == "config.json: mounts[0].type: 'tmpfs' at /scratch not supported for a task of its own (a pod's "
                            "container gets one)");
  CHECK(!fs::exists(r.bundle / "nesinit-task.json"));
}

TEST_CASE("Create, Wait before Start, Start, exit 7: the waiter and State get 7; Delete; Shutdown exits") {
  Rig r("exit 7");
  REQUIRE(r.create().status.ok());
  CHECK(fs::exists(r.bundle / "nesinit-task.json"));
  auto sh = r.call("Shutdown", Rig::id_req<v2::ShutdownRequest>());
  CHECK(sh.status.ok());
  CHECK(!r.shut_down);  // a task not yet deleted keeps its shim
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  auto st = parse<v2::StartResponse>(r.call("Start", Rig::id_req<v2::StartRequest>()));
  CHECK(st.pid() > 0);
  auto wr = parse<v2::WaitResponse>(r.answer(w));
  CHECK(wr.exit_status() == 7);
  CHECK(wr.exited_at().seconds() > 0);
  auto s = parse<v2::StateResponse>(r.call("State", Rig::id_req<v2::StateRequest>()));
  CHECK(s.status() == containerd::v1::types::STOPPED);
  CHECK(s.exit_status() == 7);
  auto k = r.call("Kill", [] { auto m = Rig::id_req<v2::KillRequest>(); m.set_signal(15); return m; }());
  CHECK(k.status.code == ttrpc::Code::not_found);
  auto d = parse<v2::DeleteResponse>(r.call("Delete", Rig::id_req<v2::DeleteRequest>()));
  CHECK(d.exit_status() == 7);
  CHECK(!fs::exists(r.bundle / "nesinit-task.json"));
  // Delete's answer is a receipt: a retried Delete and `shim delete` answer the same, exactly.
  auto again = parse<v2::DeleteResponse>(r.call("Delete", Rig::id_req<v2::DeleteRequest>()));
  CHECK(again.SerializeAsString() == d.SerializeAsString());
  const shim::Cleanup c = shim::cleanup_task(r.bundle);
  CHECK(c == shim::Cleanup{static_cast<pid_t>(d.pid()), 7, d.exited_at().seconds() * 1000000000 + d.exited_at().nanos()});
  CHECK(r.call("Shutdown", Rig::id_req<v2::ShutdownRequest>()).status.ok());
  r.io.run_for(std::chrono::milliseconds(10));
  CHECK(r.shut_down);
  // A shim started again on the bundle (the one that answered was SIGKILLed before containerd
  // heard it): the task is deleted and a retried Delete gets the receipt, identical.
  Rig replaced("exit 7", true, r.bundle);
  CHECK(replaced.task->restore().value_or("").starts_with("deleted: its receipt (exit status 7)"));
  auto third = parse<v2::DeleteResponse>(replaced.call("Delete", Rig::id_req<v2::DeleteRequest>()));
  CHECK(third.SerializeAsString() == d.SerializeAsString());
}

TEST_CASE("output lost on the way to the task's FIFOs: the task exits as neshost run does (125), with a warning") {
  // A `neshost run` that recorded exit 7 with 99 bytes of stdout lost (the record's additive
  // `lost`), and exited 125 as run does then.
  Rig r(R"(while [ $# -gt 0 ]; do case "$1" in --state) s="$2"; shift;; --vm) v="$2"; shift;; esac; shift; done
mkdir -p "$s/$v" && printf '%s\n' '{"schema_version":1,"vm":"'"$v"'","generation":1,"outcome":"exited","exit_code":7,"signal":null,"exit_status":7,"reason":"workload exited with code 7","started_at":"2026-12-02T10:00:00.000000000Z","finished_at":"2026-12-02T10:00:01.000000000Z","lost":{"stdout":99},"lost_reason":"the VM was stopped while its output was still being read"}' > "$s/$v/outcome.json"
exit 125)");
  REQUIRE(r.create().status.ok());
  // The shim's log is its stderr: caught in a file for the length of the task.
  fs::path log = r.tmp.path / "shim.log";
  host::Fd saved(::dup(2));
  {
    host::Fd f(::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    REQUIRE(f);
    ::dup2(f.get(), 2);
  }
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  REQUIRE(r.call("Start", Rig::id_req<v2::StartRequest>()).status.ok());
  auto wr = parse<v2::WaitResponse>(r.answer(w));
  ::dup2(saved.get(), 2);
  CHECK(wr.exit_status() == 125);
  std::ifstream in(log);
  std::string said((std::istreambuf_iterator<char>(in)), {});
  CHECK(said == "containerd-shim-nesinit-v2: warning: task t1: 99 bytes of stdout lost: the VM was stopped while its "
                "output was still being read (exit status 125 instead of 7)\n");
  auto d = parse<v2::DeleteResponse>(r.call("Delete", Rig::id_req<v2::DeleteRequest>()));
  CHECK(d.exit_status() == 125);
}

// Open write ends of `fifo` held by this process (the shim runs in it).
static int writers_of(const fs::path& fifo) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec) != fifo) continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    std::string key;
    std::string flags;
    while (info >> key >> flags)
      if (key == "flags:") break;
    if ((std::stoi(flags, nullptr, 8) & O_ACCMODE) == O_WRONLY) ++n;
  }
  return n;
}

/// Creates task t1 of `r` with a stdin FIFO (made in the rig's temp dir): its path.
static fs::path create_with_stdin(Rig& r) {
  const fs::path fifo = r.tmp.path / "stdin";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  v2::CreateTaskRequest c;
  c.set_id("t1");
  c.set_bundle(r.bundle.string());
  c.set_stdin(fifo.string());
  REQUIRE(r.call("Create", c).status.ok());
  return fifo;
}

TEST_CASE("stdin: the shim holds a writer on the FIFO from Start until CloseIO, as runc's shim does") {
  Rig r("cat > \"$(dirname \"$0\")/got\"; exit 5");
  const fs::path fifo = create_with_stdin(r);
  CHECK(writers_of(fifo) == 0);
  REQUIRE(r.call("Start", Rig::id_req<v2::StartRequest>()).status.ok());
  CHECK(writers_of(fifo) == 1);  // a client that detaches now is not the workload's EOF
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  auto ci = Rig::id_req<v2::CloseIORequest>();
  ci.set_stdin(false);
  REQUIRE(r.call("CloseIO", ci).status.ok());
  CHECK(writers_of(fifo) == 1);  // CloseIO without stdin closes nothing
  ci.set_stdin(true);
  REQUIRE(r.call("CloseIO", ci).status.ok());
  CHECK(writers_of(fifo) == 0);  // the last writer gone: `cat` reads EOF and the task ends
  CHECK(parse<v2::WaitResponse>(r.answer(w)).exit_status() == 5);
}

TEST_CASE("SIGKILL of a VM without a control socket kills its session: 137; Delete refused while running") {
  Rig r("exec sleep 1000");
  REQUIRE(r.create().status.ok());
  REQUIRE(r.call("Start", Rig::id_req<v2::StartRequest>()).status.ok());
  auto del = r.call("Delete", Rig::id_req<v2::DeleteRequest>());
  CHECK(del.status.code == ttrpc::Code::failed_precondition);
  auto rs = r.call("ResizePty", [] { auto m = Rig::id_req<v2::ResizePtyRequest>(); m.set_width(80); m.set_height(24); return m; }());
  CHECK(rs.status.code == ttrpc::Code::failed_precondition);  // no terminal
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  auto k = r.call("Kill", [] { auto m = Rig::id_req<v2::KillRequest>(); m.set_signal(9); return m; }());
  CHECK(k.status.ok());
  auto wr = parse<v2::WaitResponse>(r.answer(w));
  CHECK(wr.exit_status() == 137);
  CHECK(r.call("Delete", Rig::id_req<v2::DeleteRequest>()).status.ok());
}

TEST_CASE("Kill before Start ends the task as that signal; a Wait left before a failed Start is answered by Delete") {
  {
    Rig r("exit 0");
    REQUIRE(r.create().status.ok());
    auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
    REQUIRE(r.call("Kill", [] { auto m = Rig::id_req<v2::KillRequest>(); m.set_signal(15); return m; }()).status.ok());
    CHECK(parse<v2::WaitResponse>(r.answer(w)).exit_status() == 143);
  }
  {
    Rig r("exit 0");
    REQUIRE(r.create().status.ok());
    fs::remove(r.tmp.path / "neshost");  // Start cannot spawn it
    auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
    auto st = r.call("Start", Rig::id_req<v2::StartRequest>());
    CHECK(st.status.code == ttrpc::Code::internal);
    REQUIRE(r.call("Delete", Rig::id_req<v2::DeleteRequest>()).status.ok());
    CHECK(r.answer(w).status.code == ttrpc::Code::not_found);
  }
}

TEST_CASE("Create of another task on a shim whose task is not a pod's sandbox: FAILED_PRECONDITION naming it; the task untouched") {
  Rig r("exit 0");
  REQUIRE(r.create().status.ok());
  v2::CreateTaskRequest c;
  c.set_id("c1");
  c.set_bundle((r.tmp.path / "c1").string());
  auto a = r.call("Create", c);
  CHECK(a.status.code == ttrpc::Code::failed_precondition);
  CHECK(a.status.message == "container 'c1': id: this shim serves task 't1', which is not a pod's sandbox");
  auto st = parse<v2::StateResponse>(r.call("State", Rig::id_req<v2::StateRequest>()));
  CHECK(st.status() == containerd::v1::types::CREATED);
}

namespace {
// A mount namespace of the process's own, nothing propagating back: the pod's share and its
// containers' rootfs binds never reach the machine's mount table. false: not permitted here.
bool own_mount_namespace() {
  static const bool ok = ::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  return ok;
}
bool mounted_at(const fs::path& p) {
  std::ifstream f("/proc/self/mountinfo");
  for (std::string line; std::getline(f, line);)
    if (line.find(" " + p.string() + " ") != std::string::npos) return true;
  return false;
}
std::string pod_config(const std::string& type, const std::string& sandbox, const std::string& extra = "") {
  return R"({"process": {"args": ["/bin/sh"], "cwd": "/"}, "root": {"path": "rootfs"}, "hostname": "podh", )" + extra +
         R"("annotations": {"io.kubernetes.cri.container-type": ")" + type +
         R"(", "io.kubernetes.cri.sandbox-id": ")" + sandbox + R"("}})";
}
}  // namespace

TEST_CASE("a pod's sandbox: its share mounted; a container's Create checked and mounted under it; Kill before Start, Wait, Delete; Shutdown waits for the pod") {
  if (!own_mount_namespace()) {
    MESSAGE("skipped: no mount namespace of our own (needs CAP_SYS_ADMIN)");
    return;
  }
  Rig r("exec sleep 1000");
  std::ofstream(r.bundle / "config.json") << pod_config("sandbox", "t1");
  REQUIRE(r.create().status.ok());
  const fs::path share = r.bundle / "nesinit-pod";
  CHECK(mounted_at(share));
  // A read-only view of the shim's own directory: nothing in it can be renamed or made by a guest.
  CHECK(::mkdir((share / "x").c_str(), 0755) == -1);
  CHECK(errno == EROFS);
  auto rec = shim::load_task_record(r.bundle);
  REQUIRE((rec && *rec));
  CHECK((*rec)->pod_share == share);
  CHECK(!(*rec)->container);

  auto container = [&](const std::string& id, const std::string& type, const std::string& sandbox,
                       const std::string& extra = "") {
    fs::path b = r.tmp.path / id;
    fs::create_directories(b / "rootfs" / "bin");
    std::ofstream(b / "rootfs" / "mine") << id;
    std::ofstream(b / "config.json") << pod_config(type, sandbox, extra);
    v2::CreateTaskRequest c;
    c.set_id(id);
    c.set_bundle(b.string());
    return r.call("Create", c);
  };
  auto other = container("c1", "container", "elsewhere");
  CHECK(other.status.code == ttrpc::Code::invalid_argument);
  CHECK(other.status.message ==
        "container 'c1': annotations.io.kubernetes.cri.sandbox-id: sandbox 'elsewhere' is not this shim's pod (sandbox 't1')");
  // A bind whose source does not exist, a mount type the VM cannot give: refused naming the
  // container and the field, nothing recorded or mounted.
  const fs::path gone = r.tmp.path / "gone";
  auto bind = container("c2", "container", "t1",
                        R"("mounts": [{"destination": "/data", "type": "bind", "source": ")" + gone.string() +
                            R"(", "options": ["rbind"]}], )");
  CHECK(bind.status.code == ttrpc::Code::invalid_argument);
  CHECK(bind.status.message.starts_with("container 'c2': config.json: mounts[0].source: "));
  CHECK(!fs::exists(r.tmp.path / "c2" / "nesinit-task.json"));
  auto nfs = container("c2", "container", "t1", R"("mounts": [{"destination": "/n", "type": "nfs", "source": "h:/x"}], )");
  CHECK(nfs.status.code == ttrpc::Code::invalid_argument);
  CHECK(nfs.status.message.starts_with("container 'c2': config.json: mounts[0].type: 'nfs' at /n not supported"));
  auto opt = container("c2", "container", "t1", R"("mounts": [{"destination": "/t", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m", "huge=always"]}], )");
  CHECK(opt.status.code == ttrpc::Code::invalid_argument);
  CHECK(opt.status.message.starts_with("container 'c2': config.json: mounts[0].options: 'huge=always' not supported"));

  // Its volumes (a directory read-write, a file read-only, a tmpfs) beside its rootfs in the
  // pod's share: the host's directory and file themselves, ro enforced on the host too.
  const fs::path vol = r.tmp.path / "vol", file = r.tmp.path / "token";
  fs::create_directories(vol);
  std::ofstream(vol / "seen") << "host";
  std::ofstream(file) << "t1";
  REQUIRE(container("c3", "container", "t1",
                    R"("mounts": [{"destination": "/data", "type": "bind", "source": ")" + vol.string() +
                        R"(", "options": ["rbind", "rprivate", "rw"]}, {"destination": "/etc/hosts", "type": "bind", "source": ")" +
                        file.string() + R"(", "options": ["rbind", "ro"]}, {"destination": "/dev/termination-log", "type": "bind", "source": ")" +
                        file.string() + R"(", "options": ["rbind", "ro", "nosuid"]}, {"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "size=1m", "mode=1777"]}], )")
              .status.ok());
  auto crec = shim::load_task_record(r.tmp.path / "c3");
  REQUIRE((crec && *crec));
  CHECK((*crec)->container);
  CHECK((*crec)->vm == (*rec)->vm);
  const fs::path croot = (*crec)->pod_share;
  CHECK(croot.parent_path().parent_path() == share);
  CHECK(mounted_at(croot));
  CHECK(fs::exists(croot / "mine"));  // the container's root, seen through the pod's share
  // /etc/hosts is the guest's own: not carried; the directory m0, the file m1.
  const fs::path cdir = croot.parent_path();
  CHECK(mounted_at(cdir / "m0"));
  CHECK(mounted_at(cdir / "m1"));
  CHECK(!fs::exists(cdir / "m2"));
  CHECK(fs::exists(cdir / "m0" / "seen"));
  std::ofstream(cdir / "m0" / "from-share") << "x";  // read-write: a write reaches the host's directory
  CHECK(fs::exists(vol / "from-share"));
  {
    std::string t;
    std::ifstream(cdir / "m1") >> t;
    CHECK(t == "t1");
  }
  CHECK(::open((cdir / "m1").c_str(), O_WRONLY | O_CLOEXEC) == -1);
  CHECK(errno == EROFS);
  {
    auto sp = shim::parse_oci_spec(*shim::read_oci_config(r.tmp.path / "c3"), r.tmp.path / "c3");
    REQUIRE(sp);
    auto gm = shim::pod_guest_mounts(*sp, "/run/nes/pod/D");
    REQUIRE(gm.size() == 3);
    CHECK(gm[0].dst == "/data");
    CHECK(gm[0].src == "/run/nes/pod/D/m0");
    CHECK((gm[0].fs == nes::proto::FsType::bind && !gm[0].ro && gm[0].propagation == "rprivate"));
    CHECK(gm[1].dst == "/scratch");  // ordered by depth, as containerd's CRI orders them
    CHECK((gm[1].fs == nes::proto::FsType::tmpfs && gm[1].nosuid && gm[1].data == "size=1m,mode=1777"));
    CHECK(gm[2].dst == "/dev/termination-log");
    CHECK((gm[2].src == "/run/nes/pod/D/m1" && gm[2].ro && gm[2].nosuid));
  }
  CHECK(container("c3", "container", "t1").status.code == ttrpc::Code::already_exists);
  v2::StateRequest sr;
  sr.set_id("c3");
  auto st = parse<v2::StateResponse>(r.call("State", sr));
  CHECK(st.status() == containerd::v1::types::CREATED);
  CHECK(st.bundle() == (r.tmp.path / "c3").string());

  v2::WaitRequest wr;
  wr.set_id("c3");
  auto w = r.send("Wait", wr);
  v2::KillRequest kr;
  kr.set_id("c3");
  kr.set_signal(9);
  REQUIRE(r.call("Kill", kr).status.ok());
  CHECK(parse<v2::WaitResponse>(r.answer(w)).exit_status() == 137);
  // The sandbox untouched; Shutdown keeps the shim while a task of the pod is left.
  CHECK(parse<v2::StateResponse>(r.call("State", Rig::id_req<v2::StateRequest>())).status() == containerd::v1::types::CREATED);
  v2::ShutdownRequest sh;
  sh.set_id("t1");
  REQUIRE(r.call("Shutdown", sh).status.ok());
  r.io.run_for(std::chrono::milliseconds(5));
  CHECK(!r.shut_down);

  v2::DeleteRequest dr;
  dr.set_id("c3");
  auto d = parse<v2::DeleteResponse>(r.call("Delete", dr));
  CHECK(d.exit_status() == 137);
  CHECK(!mounted_at(croot));
  CHECK(!mounted_at(croot.parent_path() / "m0"));
  CHECK(!fs::exists(croot.parent_path()));
  CHECK(fs::exists(vol / "seen"));  // the host's volume untouched
  CHECK(!fs::exists(r.tmp.path / "c3" / "nesinit-task.json"));
  CHECK(fs::exists(r.tmp.path / "c3" / "rootfs" / "mine"));  // its own files untouched
  CHECK(r.call("State", sr).status.code == ttrpc::Code::not_found);
  CHECK(parse<v2::DeleteResponse>(r.call("Delete", dr)).SerializeAsString() == d.SerializeAsString());  // a receipt
  // and durable in its bundle: `shim delete` of the container answers the same.
  CHECK(shim::cleanup_task(r.tmp.path / "c3") ==
        shim::Cleanup{0, 137, d.exited_at().seconds() * 1000000000 + d.exited_at().nanos()});

  REQUIRE(r.call("Delete", Rig::id_req<v2::DeleteRequest>()).status.ok());
  CHECK(!mounted_at(share));
  CHECK(!fs::exists(share));
  CHECK(!fs::exists(r.bundle / "nesinit-pod.d"));
}

TEST_CASE("the Delete receipt round-trips; a malformed one names the field") {
  shim::Cleanup c{4242, 137, 1764900000123456789};
  auto back = shim::parse_receipt(shim::encode_receipt(c));
  REQUIRE(back);
  CHECK(*back == c);
  auto bad = shim::parse_receipt(R"({"schema_version":1,"pid":1,"exit_status":-1,"exited_at_ns":0})");
  REQUIRE(!bad);
  CHECK(bad.error().message == "nesinit-deleted.json: exit_status: expected a u32");
}

TEST_CASE("the task record: a pod's fields round-trip; a record without them parses (an older shim's)") {
  shim::TaskRecord c{"c1", "ctr-0123456789abcdef01234567", "/b/s", 0, 0, false, "/b/nesinit-pod/x/rootfs", true};
  auto back = shim::parse_task_record(shim::encode_task_record(c));
  REQUIRE(back);
  CHECK(*back == c);
  auto old = shim::parse_task_record(
      R"({"schema_version":1,"id":"t","vm":"ctr-0123456789abcdef01234567","state_dir":"/s","pid":5,"pid_start":9,"mounted_rootfs":true})");
  REQUIRE(old);
  CHECK(old->pod_share.empty());
  CHECK(!old->container);
  auto bad = shim::parse_task_record(
      R"({"schema_version":1,"id":"t","vm":"ctr-0123456789abcdef01234567","state_dir":"/s","pid":0,"pid_start":0,"mounted_rootfs":false,"container":true})");
  REQUIRE(!bad);
  CHECK(bad.error().message == "nesinit-task.json: pod_share: required for a container");
  // The task's own optional fields: stdio, terminal, created, stdin_closed.
  shim::TaskRecord t{"t", "ctr-0123456789abcdef01234567-0011223344556677", "/b/s", 42, 7, true};
  t.stdin_path = "/f/in";
  t.stdout_path = "file:///l";
  t.terminal = true;
  t.created = true;
  t.stdin_closed = true;
  auto tb = shim::parse_task_record(shim::encode_task_record(t));
  REQUIRE(tb);
  CHECK(*tb == t);
  CHECK(!old->created);
  CHECK(!old->stdin_closed);
  auto bad2 = shim::parse_task_record(
      R"({"schema_version":1,"id":"t","vm":"ctr-0123456789abcdef01234567","state_dir":"/s","pid":0,"pid_start":0,"mounted_rootfs":false,"stdin_closed":1})");
  REQUIRE(!bad2);
  CHECK(bad2.error().message == "nesinit-task.json: stdin_closed: expected a boolean");
  // The controls journal: the last number used and the ones not yet answered, in order.
  t.control_seq = 9;
  t.controls = {{7, "kill 10 3"}, {9, "pause"}};
  auto tc = shim::parse_task_record(shim::encode_task_record(t));
  REQUIRE(tc);
  CHECK(*tc == t);
  CHECK(old->control_seq == 0);
  CHECK(old->controls.empty());
  const std::string head =
      R"({"schema_version":1,"id":"t","vm":"ctr-0123456789abcdef01234567","state_dir":"/s","pid":0,"pid_start":0,"mounted_rootfs":false,)";
  auto bad3 = shim::parse_task_record(head + R"("control_seq":2,"controls":[{"seq":3,"request":"pause"}]})");
  REQUIRE(!bad3);
  CHECK(bad3.error().message == "nesinit-task.json: controls: seq: expected an integer 1..control_seq");
  auto bad4 = shim::parse_task_record(head + R"("control_seq":2,"controls":[{"seq":2}]})");
  REQUIRE(!bad4);
  CHECK(bad4.error().message == "nesinit-task.json: controls: request: expected a string");
  auto bad5 = shim::parse_task_record(head + R"("control_seq":"x"})");
  REQUIRE(!bad5);
  CHECK(bad5.error().message == "nesinit-task.json: control_seq: expected an integer");
}

TEST_CASE("unknown ids and exec ids are NOT_FOUND; Exec, Pause and Stats need a running task; Update names what it cannot change") {
  Rig r("exit 0");
  REQUIRE(r.create().status.ok());
  v2::StateRequest other;
  other.set_id("t2");
  CHECK(r.call("State", other).status.code == ttrpc::Code::not_found);
  auto ex = r.call("Exec", Rig::id_req<v2::ExecProcessRequest>());
  CHECK(ex.status.code == ttrpc::Code::failed_precondition);
  CHECK(ex.status.message.find("not running") != std::string::npos);
  v2::StateRequest no_exec;
  no_exec.set_id("t1");
  no_exec.set_exec_id("nope");
  auto ne = r.call("State", no_exec);
  CHECK(ne.status.code == ttrpc::Code::not_found);
  CHECK(ne.status.message == "exec nope: not found");
  auto pa = r.call("Pause", Rig::id_req<v2::PauseRequest>());
  CHECK(pa.status.code == ttrpc::Code::failed_precondition);
  CHECK(pa.status.message == "pause: task t1 is not running");
  CHECK(r.call("Resume", Rig::id_req<v2::ResumeRequest>()).status.code == ttrpc::Code::failed_precondition);
  CHECK(r.call("Stats", Rig::id_req<v2::StatsRequest>()).status.code == ttrpc::Code::failed_precondition);
  CHECK(r.call("Checkpoint", Rig::id_req<v2::CheckpointTaskRequest>()).status.code == ttrpc::Code::unimplemented);
  // Update: containerd's LinuxResources JSON; what it asks for is named, nothing is changed.
  auto up = Rig::id_req<v2::UpdateTaskRequest>();
  up.mutable_resources()->set_type_url("types.containerd.io/opencontainers/runtime-spec/1/LinuxResources");
  up.mutable_resources()->set_value(R"({"memory":{"limit":268435456,"swap":null},"cpu":{"quota":50000,"period":100000}})");
  auto u = r.call("Update", up);
  CHECK(u.status.code == ttrpc::Code::failed_precondition);
  CHECK(u.status.message.starts_with("Update: cannot change memory.limit, cpu.quota, cpu.period of task t1 live: "));
  CHECK(r.call("Update", Rig::id_req<v2::UpdateTaskRequest>()).status.ok());  // asks for nothing
  up.mutable_resources()->set_value("not json");
  CHECK(r.call("Update", up).status.message.starts_with(
      "Update: cannot change resources of type types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"));
  auto bad = r.answer([&] {
    std::uint32_t s = r.next_stream;
    r.next_stream += 2;
    std::string f = ttrpc::encode_frame(s, ttrpc::MsgType::request,
                                        ttrpc::encode_request({"containerd.task.v2.Task", "Kill", "\x0a\x7f", 0, {}}));
    REQUIRE(::write(r.client, f.data(), f.size()) == static_cast<ssize_t>(f.size()));
    return s;
  }());
  CHECK(bad.status.code == ttrpc::Code::invalid_argument);
}

namespace {
/// NESINIT_SHIM_FAULT set for as long as it lives (fault_point.hpp: read at each write).
struct Fault {
  explicit Fault(const char* point) { ::setenv("NESINIT_SHIM_FAULT", point, 1); }
  ~Fault() { clear(); }
  void clear() { ::unsetenv("NESINIT_SHIM_FAULT"); }
};
bool names_eio(const ttrpc::Reply& a, const fs::path& file) {
  return a.status.message.find(file.string()) != std::string::npos &&
         a.status.message.find("Input/output error") != std::string::npos;
}
}  // namespace

TEST_CASE("durable writes: a Delete whose receipt cannot be written fails naming the file and errno; nothing is removed or told; the retry answers") {
  if (!shim::fault_points_built()) {
    MESSAGE("skipped: this build has no fault points (meson option fault_points)");
    return;
  }
  Rig r("exit 7");
  REQUIRE(r.create().status.ok());
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  REQUIRE(r.call("Start", Rig::id_req<v2::StartRequest>()).status.ok());
  auto wr = parse<v2::WaitResponse>(r.answer(w));
  REQUIRE(wr.exit_status() == 7);
  Fault f("eio:receipt:delete");
  auto d = r.call("Delete", Rig::id_req<v2::DeleteRequest>());
  CHECK(d.status.code == ttrpc::Code::internal);
  CHECK(names_eio(d, r.bundle / "nesinit-deleted.json"));
  CHECK(d.status.message.starts_with("task t1: delete: receipt: "));
  CHECK(fs::exists(r.bundle / "nesinit-task.json"));  // nothing removed
  CHECK(!fs::exists(r.bundle / "nesinit-deleted.json"));
  auto s = parse<v2::StateResponse>(r.call("State", Rig::id_req<v2::StateRequest>()));
  CHECK(s.status() == containerd::v1::types::STOPPED);  // still there, not deleted
  CHECK(s.exit_status() == 7);
  CHECK(r.call("Shutdown", Rig::id_req<v2::ShutdownRequest>()).status.ok());
  r.io.run_for(std::chrono::milliseconds(10));
  CHECK(!r.shut_down);  // an undeleted task keeps its shim
  f.clear();
  auto again = parse<v2::DeleteResponse>(r.call("Delete", Rig::id_req<v2::DeleteRequest>()));
  CHECK(again.exit_status() == 7);
  CHECK(again.exited_at().SerializeAsString() == wr.exited_at().SerializeAsString());
  CHECK(fs::exists(r.bundle / "nesinit-deleted.json"));
  CHECK(!fs::exists(r.bundle / "nesinit-task.json"));
}

TEST_CASE("durable writes: a CloseIO whose record cannot be written fails naming the file and errno; stdin stays held; the retry closes it") {
  if (!shim::fault_points_built()) {
    MESSAGE("skipped: this build has no fault points (meson option fault_points)");
    return;
  }
  Rig r("cat > \"$(dirname \"$0\")/got\"; exit 5");
  const fs::path fifo = create_with_stdin(r);
  REQUIRE(r.call("Start", Rig::id_req<v2::StartRequest>()).status.ok());
  auto w = r.send("Wait", Rig::id_req<v2::WaitRequest>());
  auto ci = Rig::id_req<v2::CloseIORequest>();
  ci.set_stdin(true);
  Fault f("eio:record:close-io");
  auto a = r.call("CloseIO", ci);
  CHECK(a.status.code == ttrpc::Code::internal);
  CHECK(names_eio(a, r.bundle / "nesinit-task.json"));
  CHECK(writers_of(fifo) == 1);  // nothing closed: the workload has not seen EOF
  auto rec = shim::load_task_record(r.bundle);
  REQUIRE(rec);
  REQUIRE(*rec);
  CHECK(!(*rec)->stdin_closed);
  f.clear();
  REQUIRE(r.call("CloseIO", ci).status.ok());
  CHECK(writers_of(fifo) == 0);
  rec = shim::load_task_record(r.bundle);
  REQUIRE(rec);
  REQUIRE(*rec);
  CHECK((*rec)->stdin_closed);
  CHECK(parse<v2::WaitResponse>(r.answer(w)).exit_status() == 5);
}

TEST_CASE("durable writes: a Create whose record cannot be written fails naming the file and errno; nothing is left") {
  if (!shim::fault_points_built()) {
    MESSAGE("skipped: this build has no fault points (meson option fault_points)");
    return;
  }
  for (const char* point : {"eio:record:create", "eio:record:created"}) {
    CAPTURE(point);
    Rig r("exit 0");
    Fault f(point);
    auto a = r.create();
    CHECK(a.status.code == ttrpc::Code::internal);
    CHECK(names_eio(a, r.bundle / "nesinit-task.json"));
    CHECK(!fs::exists(r.bundle / "nesinit-task.json"));  // the intent undone, or never written
    auto s = r.call("State", Rig::id_req<v2::StateRequest>());
    CHECK(s.status.code == ttrpc::Code::not_found);
    f.clear();
    CHECK(r.create().status.ok());  // the retry
  }
}
