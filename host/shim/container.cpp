// One task of the shim: the shim's own or a pod's container (host/shim/container.hpp). Its
// VM's monitor (the shim's own task's): container_vm.cpp.
#include "host/shim/container.hpp"

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "host/shim/durable.hpp"
#include "host/shim/exec_journal.hpp"
#include "host/shim/fault_point.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/log.hpp"
#include "host/shim/mount_points.hpp"
#include "host/shim/pod_mounts.hpp"
#include "host/shim/pod.hpp"
#include "host/shim/rpc.hpp"
#include "host/shim/task_mounts.hpp"

namespace nes::shim {
namespace fs = std::filesystem;
namespace v2 = containerd::task::v2;
namespace ev = containerd::events;
using host::Error;
using rpc::empty;
using rpc::fail;
using rpc::ok;

// ---- receipts ----

void Receipts::keep(const ProcKey& k, const v2::DeleteResponse& r) {
  if (by_key.emplace(k, r).second) order.push_back(k);
  if (order.size() > kMax) {
    by_key.erase(order.front());
    order.erase(order.begin());
  }
}

void Receipts::forget(const ProcKey& k) {
  if (by_key.erase(k)) std::erase(order, k);
}

std::int64_t ns_of(const google::protobuf::Timestamp& t) {
  return static_cast<std::int64_t>(t.seconds()) * 1000000000 + t.nanos();
}

v2::DeleteResponse receipt_response(std::uint32_t pid, std::uint32_t status, std::int64_t at_ns) {
  v2::DeleteResponse r;
  r.set_pid(pid);
  r.set_exit_status(status);
  set_time(r.mutable_exited_at(), at_ns);
  return r;
}

namespace {

/// The receipt in `bundle`, durably, for `shim delete` after this shim is gone (and a retry
/// that reaches a replacement). `point`: its fault point (durable.hpp). Errors name the file.
host::Status write_receipt(std::string_view point, const fs::path& bundle, const v2::DeleteResponse& r) {
  return write_durable_at(point, bundle, kReceiptFile,
                          encode_receipt(Cleanup{static_cast<pid_t>(r.pid()), r.exit_status(), ns_of(r.exited_at())}));
}

/// /tasks/create for `id` in `bundle` made from `req` with `io` (the process's stdio as kept).
void publish_create(Publisher& events, const std::string& id, const fs::path& bundle, const v2::CreateTaskRequest& req,
                    const Process& io) {
  ev::TaskCreate e;
  e.set_container_id(id);
  e.set_bundle(bundle.string());
  *e.mutable_rootfs() = req.rootfs();
  e.mutable_io()->set_stdin(io.stdin_path);
  e.mutable_io()->set_stdout(io.stdout_path);
  e.mutable_io()->set_stderr(io.stderr_path);
  e.mutable_io()->set_terminal(io.terminal);
  e.set_pid(static_cast<std::uint32_t>(::getpid()));
  events.publish("/tasks/create", e);
}

/// /tasks/delete for `id` as `r` answered.
void publish_delete(Publisher& events, const std::string& id, const v2::DeleteResponse& r) {
  ev::TaskDelete e;
  e.set_container_id(id);
  e.set_pid(r.pid());
  e.set_exit_status(r.exit_status());
  *e.mutable_exited_at() = r.exited_at();
  events.publish("/tasks/delete", e);
}

}  // namespace

// ---- the shim ----

Shim::Shim(boost::asio::io_context& io, ServiceConfig cfg, Publisher& events)
    : io(io), cfg(std::move(cfg)), events(events) {
  auto c = std::make_unique<Container>(*this, this->cfg.id, true);
  own_ = c.get();
  containers.emplace(this->cfg.id, std::move(c));
}

Shim::~Shim() {
  for (auto& t : askers)
    if (t.joinable()) t.join();
}

fs::path Shim::control() const { return host::control_path(own().rec.state_dir, own().rec.vm); }

ExecProc* Shim::find(const ProcKey& k) {
  auto it = containers.find(k.first);
  if (it == containers.end()) return nullptr;
  Container& c = *it->second;
  if (k.second.empty()) return c.own ? nullptr : c.init.get();
  auto x = c.execs.find(k.second);
  return x == c.execs.end() ? nullptr : x->second.get();
}

Container* Shim::pod_container(const std::string& id) {
  auto it = containers.find(id);
  return it == containers.end() || it->second->own ? nullptr : it->second.get();
}

host::Status Shim::persist_execs(std::string_view point) { return save_exec_journal(*this, point); }

void Shim::note_execs(std::string_view point) {
  if (auto w = persist_execs(point); !w) log("warning: task {}: exec journal: {}", cfg.id, w.error().message);
}

// ---- a container ----

Container::Container(Shim& shim, std::string id_, bool own_task)
    : shim(shim), id(std::move(id_)), own(own_task), kill_timer_(shim.io) {
  task.id = id;
  if (own) bundle = shim.cfg.bundle;
}

host::Status Container::persist(std::string_view point) {
  return write_durable_at(point, bundle, kTaskFile, encode_task_record(rec));
}


ttrpc::Reply Container::create_task(const v2::CreateTaskRequest& req) {
  if (task.phase != Phase::none) return fail(ttrpc::Code::already_exists, fmt::format("task {}: already exists", req.id()));
  if (!req.checkpoint().empty()) return fail(ttrpc::Code::unimplemented, "checkpoint: restore is not supported");
  if (const std::string* io = rpc::unsupported_stdio(req))
    return fail(ttrpc::Code::invalid_argument,
                fmt::format("stdio '{}': only FIFO paths and file:// are supported (no binary:// loggers)", *io));
  if (!req.bundle().empty() && fs::path(req.bundle()) != bundle)
    return fail(ttrpc::Code::invalid_argument,
                fmt::format("bundle: '{}' is not this shim's bundle '{}'", req.bundle(), bundle.string()));
  auto text = read_oci_config(bundle);
  if (!text) return fail(ttrpc::Code::invalid_argument, text.error().message);
  auto s = parse_oci_spec(*text, bundle);
  if (!s) return fail(ttrpc::Code::invalid_argument, s.error().message);
  // A tmpfs where the init mounts none: a pod's container gets one (pod_mounts.hpp); `neshost
  // run` has no flag for it, so a task of its own refuses it.
  if (!s->tmpfs.empty())
    return fail(ttrpc::Code::invalid_argument,
                fmt::format("config.json: {}.type: 'tmpfs' at {} not supported for a task of its own (a pod's container "
                            "gets one)", s->tmpfs.front().field, s->tmpfs.front().guest));
  // A pod's sandbox (`shim start` already refused a bad placement): the VM of the pod, sized
  // for it.
  bool& pod = shim.pod;
  if (auto pl = parse_pod_placement(*text, id)) pod = pl->role == PodRole::sandbox;
  if (pod) {
    auto size = parse_pod_size(*text, id);
    if (!size) return fail(ttrpc::Code::invalid_argument, size.error().message);
    if (size->mem_mib != kPodBaseMemMib) s->mem_mib = size->mem_mib;
    if (size->cpus != kPodBaseCpus) s->cpus = size->cpus;
  }
  rec = TaskRecord{};
  std::error_code rc;
  fs::remove(bundle / kReceiptFile, rc);      // an earlier incarnation's answer is not this one's
  fs::remove(bundle / kExecJournalFile, rc);  // nor its execs
  rec.id = id;
  // A new incarnation: a VM id of its own (identity.hpp), said in the shim's log.
  const std::string incarnation = new_incarnation();
  rec.vm = incarnation_vm_id(shim.cfg.ns, id, incarnation);
  log("task {}: incarnation {} (VM {})", id, incarnation, rec.vm);
  rec.state_dir = bundle / "nesinit-state";
  if (req.rootfs_size() > 1)
    return fail(ttrpc::Code::invalid_argument, fmt::format("rootfs: {} mounts; one is supported", req.rootfs_size()));
  // Intent before effect: the record names every mount this Create may make before it makes
  // one, so a shim killed in between leaves `shim delete` a record to undo it by (an unmount
  // of what was not mounted yet fails harmlessly); never a mount nobody knows of.
  rec.mounted_rootfs = req.rootfs_size() == 1;
  rec.stdin_path = req.stdin();
  rec.stdout_path = req.stdout();
  rec.stderr_path = req.stderr();
  rec.terminal = req.terminal();
  if (pod) rec.pod_share = bundle / kPodShareDir;
  if (auto w = persist("record:create"); !w) return fail(ttrpc::Code::internal, w.error().message);
  if (auto m = create_task_mounts(req, *s, pod); !m.status.ok()) return m;
  // Done: what a replaced shim restores as CREATED (restore()).
  rec.created = true;
  if (auto w = persist("record:created"); !w) {
    remove_task(bundle, rec);
    return fail(ttrpc::Code::internal, w.error().message);
  }
  spec = std::move(*s);
  task.stdin_path = req.stdin();
  task.stdout_path = req.stdout();
  task.stderr_path = req.stderr();
  task.terminal = req.terminal();
  spec.terminal = task.terminal || spec.terminal;
  task.phase = Phase::created;
  publish_create(shim.events, id, bundle, req, task);
  v2::CreateTaskResponse r;
  r.set_pid(static_cast<std::uint32_t>(::getpid()));
  return ok(r);
}

/// Create's mounts, once the record names them: the rootfs, a read-only root's mount points,
/// a pod's share (`s` gets its volume). An error removes what was made.
ttrpc::Reply Container::create_task_mounts(const v2::CreateTaskRequest& req, TaskSpec& s, bool pod) {
  if (req.rootfs_size() == 1) {
    std::error_code ec;
    fs::create_directories(bundle / "rootfs", ec);
    if (auto m = mount_rootfs(req.rootfs(0), bundle / "rootfs"); !m) {
      remove_task(bundle, rec);
      return fail(ttrpc::Code::invalid_argument, m.error().message);
    }
    fault_point("create:mounted");
  }
  std::error_code ec;
  if (!fs::is_directory(s.root, ec)) {
    remove_task(bundle, rec);
    return fail(ttrpc::Code::invalid_argument, fmt::format("root.path: {} is not a directory", s.root.string()));
  }
  // A read-only root gets its mount points first, as runc makes them (the guest cannot).
  if (s.root_ro)
    if (auto m = make_mount_points(s.root, s.volumes); !m) {
      remove_task(bundle, rec);
      return fail(ttrpc::Code::invalid_argument, m.error().message);
    }
  if (pod) {
    // The pod's share: a read-only, shared view of the shim's own directory (task_mounts.hpp).
    if (auto m = make_pod_share(rec.pod_share); !m) {
      remove_task(bundle, rec);
      return fail(ttrpc::Code::internal, fmt::format("pod share {}: {}", rec.pod_share.string(), m.error().message));
    }
    fault_point("create:pod-share");
    s.volumes.push_back(Volume{rec.pod_share, std::string(kPodShareGuest), false});
  }
  return empty();
}

namespace {

/// A pod container's Create checked against the shim and its bundle's config.json: its spec, or
/// the error naming the container and the field.
host::Result<TaskSpec> check_in_pod(Shim& shim, const v2::CreateTaskRequest& req, ttrpc::Reply& refused) {
  const std::string& cid = req.id();
  auto refuse = [&](ttrpc::Code c, std::string_view field, const std::string& why) {
    refused = fail(c, fmt::format("container '{}': {}: {}", cid, field, why));
    return Error{"refused"};
  };
  const std::string& sid = shim.cfg.id;
  if (!shim.pod)
    return refuse(ttrpc::Code::failed_precondition, "id", fmt::format("this shim serves task '{}', which is not a pod's sandbox", sid));
  if (shim.pod_container(cid)) {
    refused = fail(ttrpc::Code::already_exists, fmt::format("task {}: already exists", cid));
    return Error{"refused"};
  }
  shim.receipts.forget({cid, {}});  // a re-created container is a new task
  const Phase sandbox = shim.own().task.phase;
  if (sandbox != Phase::created && sandbox != Phase::running)
    return refuse(ttrpc::Code::failed_precondition, kSandboxIdAnnotation, fmt::format("sandbox '{}' has ended", sid));
  if (!req.checkpoint().empty()) return refuse(ttrpc::Code::unimplemented, "checkpoint", "restore is not supported");
  if (const std::string* io = rpc::unsupported_stdio(req))
    return refuse(ttrpc::Code::invalid_argument, "stdio", fmt::format("'{}': only FIFO paths and file:// are supported", *io));
  if (req.bundle().empty() || req.bundle().front() != '/')
    return refuse(ttrpc::Code::invalid_argument, "bundle", "expected an absolute path");
  const fs::path bundle = req.bundle();
  auto text = read_oci_config(bundle);
  if (!text) {
    refused = fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, text.error().message));
    return Error{"refused"};
  }
  auto pl = parse_pod_placement(*text, cid);
  if (!pl) {
    refused = fail(ttrpc::Code::invalid_argument, pl.error().message);
    return Error{"refused"};
  }
  if (pl->role != PodRole::container || pl->sandbox_id != sid)
    return refuse(ttrpc::Code::invalid_argument, fmt::format("annotations.{}", kSandboxIdAnnotation),
                  pl->role == PodRole::container
                      ? fmt::format("sandbox '{}' is not this shim's pod (sandbox '{}')", pl->sandbox_id, sid)
                      : fmt::format("expected a container of sandbox '{}' ({} 'container')", sid, kContainerTypeAnnotation));
  auto sp = parse_oci_spec(*text, bundle);
  if (!sp) {
    refused = fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, sp.error().message));
    return Error{"refused"};
  }
  // Every other bind is carried through the pod's share (pod_mounts.hpp); a missing source or a
  // type the VM cannot give was refused by parse_oci_spec, naming mounts[N].
  if (req.rootfs_size() > 1)
    return refuse(ttrpc::Code::invalid_argument, "rootfs", fmt::format("{} mounts; one is supported", req.rootfs_size()));
  return sp;
}

}  // namespace

host::Status Container::mount_in_pod(const v2::CreateTaskRequest& req, const TaskSpec& sp, const std::string& dir) {
  // The mount point in the shim's own directory; the mount on the view (what propagates).
  std::error_code ec;
  const fs::path real = pod_share_real(shim.own().rec.pod_share, fs::path(dir) / "rootfs");
  fs::create_directories(real, ec);
  if (ec) return Error{fmt::format("rootfs: mkdir {}: {}", real.string(), ec.message())};
  if (req.rootfs_size() == 1) {
    if (auto m = mount_rootfs(req.rootfs(0), rec.pod_share); !m) return m;
  } else if (::mount(sp.root.c_str(), rec.pod_share.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return Error{fmt::format("root.path: bind {} on {}: {}", sp.root.string(), rec.pod_share.string(), std::strerror(errno))};
  }
  // Its volumes beside its rootfs in the pod's share (the record names the directory already).
  return mount_pod_volumes(shim.own().rec.pod_share, dir, sp);
}

ttrpc::Reply Container::create_in_pod(Shim& shim, const v2::CreateTaskRequest& req) {
  ttrpc::Reply refused;
  auto sp = check_in_pod(shim, req, refused);
  if (!sp) return refused;
  const std::string& cid = req.id();
  const Container& sandbox = shim.own();
  auto c = std::make_unique<Container>(shim, cid, false);
  const std::string dir = vm_id(shim.cfg.ns, cid);
  c->bundle = req.bundle();
  c->rec.id = cid;
  c->rec.vm = sandbox.rec.vm;
  c->rec.state_dir = sandbox.rec.state_dir;
  c->rec.pod_share = sandbox.rec.pod_share / dir / "rootfs";
  c->rec.container = true;
  c->guest_root = fmt::format("{}/{}/rootfs", kPodShareGuest, dir);
  std::error_code rc;
  fs::remove(c->bundle / kReceiptFile, rc);  // an earlier incarnation's answer is not this one's
  // Intent before effect: the record first, so `shim delete` finds whatever gets mounted.
  if (auto w = write_durable_at("record:container-create", c->bundle, kTaskFile, encode_task_record(c->rec)); !w)
    return fail(ttrpc::Code::internal, fmt::format("container '{}': bundle: {}", cid, w.error().message));
  if (auto m = c->mount_in_pod(req, *sp, dir); !m) {
    remove_task(c->bundle, c->rec);
    return fail(ttrpc::Code::invalid_argument, fmt::format("container '{}': {}", cid, m.error().message));
  }
  if (!sp->hostname.empty()) c->hostname = sp->hostname;
  else if (!sandbox.spec.hostname.empty()) c->hostname = sandbox.spec.hostname;
  c->init = std::make_unique<ExecProc>(shim, cid, std::string());
  ExecProc& x = *c->init;
  x.stdin_path = req.stdin();
  x.stdout_path = req.stdout();
  x.stderr_path = req.stderr();
  x.terminal = req.terminal() || sp->terminal;
  x.spec = std::move(*sp);
  const fs::path bundle = c->bundle;
  const TaskRecord made = c->rec;
  Container& added = *shim.containers.emplace(cid, std::move(c)).first->second;
  // The pod's journal before the answer: a replaced shim serves this container too.
  if (auto w = shim.persist_execs("journal:container-create"); !w) {
    shim.containers.erase(cid);
    remove_task(bundle, made);
    return fail(ttrpc::Code::internal, fmt::format("container '{}': journal: {}", cid, w.error().message));
  }
  publish_create(shim.events, cid, bundle, req, *added.init);
  v2::CreateTaskResponse r;
  r.set_pid(static_cast<std::uint32_t>(::getpid()));
  return ok(r);
}

// ---- start, kill, state ----

void Container::start(ExecProc* x, ttrpc::Respond respond) {
  if (own && !x) return respond(spawn());
  ExecProc& p = x ? *x : *init;
  if (p.phase != Phase::created)
    return respond(fail(ttrpc::Code::failed_precondition, fmt::format("{} {}: already started", p.exec ? "exec" : "task", p.id)));
  const std::string& sid = shim.cfg.id;
  if (shim.own().task.phase != Phase::running)
    return respond(fail(ttrpc::Code::failed_precondition,
                        p.task == sid ? fmt::format("task {}: not running", sid)
                                      : fmt::format("container '{}': sandbox '{}' is not running", p.task, sid)));
  std::optional<std::uint16_t> in;  // an exec in a pod's container joins it
  if (p.exec && !own) {
    if (init->phase != Phase::running || init->proc == 0)
      return respond(fail(ttrpc::Code::failed_precondition, fmt::format("task {}: not running", p.task)));
    in = init->proc;
  }
  p.start(in, std::move(respond));
}

ttrpc::Reply Container::kill(ExecProc* x, std::uint32_t signal, bool all) {
  if ((x ? *x : process()).phase == Phase::stopped) return fail(ttrpc::Code::not_found, "process already finished");
  // `all` (runc's `kill --all`: every process of the task): its execs are signalled too, each
  // through its own process group, before the task's own.
  if (all && !x)
    for (auto& [eid, e] : execs)
      if (e->phase == Phase::running || e->start_respond) (void)e->kill(signal);
  if (!x && !own && init->phase == Phase::created && !init->start_respond) {  // a pod's container never started
    init->stop(128 + signal, now_ns());
    init->report_exit(shim.events, init->task);
    return empty();
  }
  if (x) return x->kill(signal);
  if (!own) return init->kill(signal);
  return kill_task(signal);
}

v2::StateResponse Container::state(ExecProc* x) const {
  auto st = (x ? static_cast<const Process&>(*x) : process()).state(bundle.string());
  if (own && !x && task.phase == Phase::running && vm_paused()) st.set_status(containerd::v1::types::Status::PAUSED);
  return st;
}

// ---- delete ----

ttrpc::Reply Container::del(ExecProc* x) {
  ExecProc* p = x ? x : init.get();  // null: the shim's own task
  const Process& pr = p ? *p : task;
  if (pr.phase == Phase::running)
    return fail(ttrpc::Code::failed_precondition, fmt::format("{}: still running", p ? p->name() : "task " + pr.id));
  if (p && p->start_respond) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: starting", p->name()));
  v2::DeleteResponse r = pr.delete_response();
  if (!x && !own) {
    Shim& s = shim;
    const std::string cid = id;
    auto d = delete_in_pod();  // `this` is gone after it
    if (!d) return fail(ttrpc::Code::internal, d.error().message);
    s.receipts.keep({cid, {}}, *d);
    return ok(*d);
  }
  if (x) {
    // The receipt journaled before the answer; not durable: the exec stays as it was (stopped,
    // not deleted) and the Delete fails naming the journal.
    const ProcKey k = x->key();
    auto held = std::move(execs.at(x->id));
    execs.erase(k.second);
    shim.receipts.keep(k, r);
    if (auto w = shim.persist_execs("journal:exec-delete"); !w) {
      shim.receipts.forget(k);
      execs.emplace(k.second, std::move(held));
      return fail(ttrpc::Code::internal, fmt::format("exec {}: delete: journal: {}", k.second, w.error().message));
    }
    boost::system::error_code ig;
    held->sock.close(ig);
    return ok(r);
  }
  // The receipt first: whatever asks after this (a retry, `shim delete`) gets the same answer.
  // Not durable: nothing is removed or told, the task stays stopped, the Delete fails.
  if (auto w = write_receipt("receipt:delete", bundle, r); !w)
    return fail(ttrpc::Code::internal, fmt::format("task {}: delete: receipt: {}", id, w.error().message));
  fault_point("delete:receipt");
  remove_task(bundle, rec);
  task.phase = Phase::deleted;
  // A Wait sent before a Start that failed is answered now (the task is gone).
  for (auto& w : std::exchange(task.waiters, {})) w(fail(ttrpc::Code::not_found, fmt::format("task {}: deleted", id)));
  publish_delete(shim.events, id, r);
  return ok(r);
}

/// Delete of a pod's container that is not running: its receipt written in its bundle first
/// (its failure fails the Delete, nothing removed or told: the error names the file), then its
/// execs go with it, its rootfs is unmounted from the pod's share, its record removed;
/// /tasks/delete published; the container gone from the shim (`this` with it).
host::Result<v2::DeleteResponse> Container::delete_in_pod() {
  v2::DeleteResponse r = init->delete_response();
  if (auto w = write_receipt("receipt:container-delete", bundle, r); !w)
    return Error{fmt::format("container '{}': delete: receipt: {}", id, w.error().message)};
  for (auto it = execs.begin(); it != execs.end();) {
    // Gone with its container (its pid namespace ended): its exit told, its Start answered.
    if (it->second->phase != Phase::stopped) it->second->ended(137, "its container was deleted", false);
    it = execs.erase(it);
  }
  boost::system::error_code ig;
  init->sock.close(ig);
  remove_task(bundle, rec);
  publish_delete(shim.events, id, r);
  Shim& s = shim;
  auto self = std::move(s.containers.at(id));
  s.containers.erase(id);
  // Its receipt, its execs gone. A failure leaves the journal naming it stopped; a replacement
  // then finds its record gone and its receipt in its bundle, and answers with that receipt.
  s.note_execs("journal:container-delete");
  return r;
}

// ---- stdin, terminal, execs ----

ttrpc::Reply Container::close_stdin(ExecProc* x) {
  ExecProc* p = x ? x : init.get();  // null: the shim's own task
  // Recorded first (an exec's in the journal, the task's in its record: a replacement then
  // holds no writer again and tells the monitor again); not durable: nothing is closed and
  // CloseIO fails naming the file, so a retry does it all.
  if (p && !p->stdin_closed) {
    p->stdin_closed = true;
    if (auto w = shim.persist_execs("journal:close-io"); !w) {
      p->stdin_closed = false;
      return fail(ttrpc::Code::internal, fmt::format("{}: CloseIO: journal: {}", p->name(), w.error().message));
    }
  }
  // The task's monitor holds a writer too (--stdin-hold): told to let go.
  const bool tell_monitor = !p && !task.stdin_path.empty() && task.phase == Phase::running && !close_stdin_told_;
  if (tell_monitor && !rec.stdin_closed) {
    rec.stdin_closed = true;
    if (auto w = persist("record:close-io"); !w) {
      rec.stdin_closed = false;
      return fail(ttrpc::Code::internal, fmt::format("task {}: CloseIO: record: {}", id, w.error().message));
    }
  }
  fault_point("close-io:recorded");  // a replacement holds no writer and tells the monitor again
  (p ? static_cast<Process&>(*p) : task).stdin_hold.reset();
  if (tell_monitor) deliver_close_stdin();
  return empty();
}

ttrpc::Reply Container::resize(ExecProc* x, std::uint32_t height, std::uint32_t width) {
  if (ExecProc* p = x ? x : init.get()) return p->resize(height, width);
  if (task.phase != Phase::running) return fail(ttrpc::Code::failed_precondition, "task is not running");
  if (!spec.terminal) return fail(ttrpc::Code::failed_precondition, "the task has no terminal");
  deliver_resize(height, width);
  return empty();
}

ttrpc::Reply Container::add_exec(const v2::ExecProcessRequest& req) {
  if (process().phase != Phase::running) return fail(ttrpc::Code::failed_precondition, fmt::format("task {}: not running", id));
  if (req.exec_id().empty() || req.exec_id().size() > 256)
    return fail(ttrpc::Code::invalid_argument, "exec_id: expected 1..256 bytes");
  if (execs.count(req.exec_id()))
    return fail(ttrpc::Code::already_exists, fmt::format("exec {}: already exists", req.exec_id()));
  shim.receipts.forget({id, req.exec_id()});
  if (execs.size() >= kExecLiveMax)  // per task, as the guest's own bound (proto::kExecMax)
    return fail(ttrpc::Code::resource_exhausted, fmt::format("exec: {} execs exist already (delete ended ones)", kExecLiveMax));
  if (const std::string* io = rpc::unsupported_stdio(req))
    return fail(ttrpc::Code::invalid_argument, fmt::format("stdio '{}': only FIFO paths and file:// are supported", *io));
  if (req.spec().value().size() > kExecSpecMax)
    return fail(ttrpc::Code::invalid_argument,
                fmt::format("spec: {} bytes, over {}: the VM's monitor takes an exec request of at most 64 KiB",
                            req.spec().value().size(), kExecSpecMax));
  auto sp = parse_oci_process(req.spec().value());
  if (!sp) return fail(ttrpc::Code::invalid_argument, "spec: " + sp.error().message);
  auto x = std::make_unique<ExecProc>(shim, id, req.exec_id());
  x->spec = std::move(*sp);
  x->spec_json = req.spec().value();
  x->stdin_path = req.stdin();
  x->stdout_path = req.stdout();
  x->stderr_path = req.stderr();
  x->terminal = req.terminal() || x->spec.terminal;
  execs.emplace(req.exec_id(), std::move(x));
  // Journaled before it is answered: a replacement shim can start what containerd was told exists.
  if (auto w = shim.persist_execs("journal:exec-add"); !w) {
    execs.erase(req.exec_id());
    return fail(ttrpc::Code::internal, fmt::format("exec {}: journal: {}", req.exec_id(), w.error().message));
  }
  ev::TaskExecAdded e;
  e.set_container_id(id);
  e.set_exec_id(req.exec_id());
  shim.events.publish("/tasks/exec-added", e);
  return empty();
}

}  // namespace nes::shim
