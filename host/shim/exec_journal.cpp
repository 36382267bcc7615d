// The task's exec journal (host/shim/exec_journal.hpp).
#include "host/shim/exec_journal.hpp"

#include <set>
#include <tuple>

#include <fmt/format.h>
#include <simdjson.h>

#include "base/small_file.hpp"
#include "host/lib/record.hpp"
#include "host/shim/container.hpp"
#include "host/shim/durable.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/log.hpp"
#include "host/shim/task_mounts.hpp"

namespace nes::shim {

namespace {
constexpr ExecState kStates[] = {ExecState::added, ExecState::starting, ExecState::running, ExecState::stopped,
                                 ExecState::deleted};
}

std::string_view to_string(ExecState s) {
  switch (s) {
    case ExecState::added: return "added";
    case ExecState::starting: return "starting";
    case ExecState::running: return "running";
    case ExecState::stopped: return "stopped";
    case ExecState::deleted: return "deleted";
  }
  return "?";
}

std::string encode_exec_journal(const std::vector<ExecEntry>& execs) {
  std::string out = R"({"schema_version":1,"execs":[)";
  bool first = true;
  for (const auto& e : execs) {
    out += first ? "" : ",";
    first = false;
    out += fmt::format(
        R"({{"id":{},"spec":{},"stdin":{},"stdout":{},"stderr":{},"terminal":{},"state":"{}","proc":{},"pid":{},"exit_status":{},"exited_at_ns":{}}})",
        host::json_string(e.id), host::json_string(e.spec), host::json_string(e.stdin_path),
        host::json_string(e.stdout_path), host::json_string(e.stderr_path), e.terminal, to_string(e.state), e.proc,
        e.pid, e.exit_status, e.exited_at_ns);
    if (!e.task.empty() || e.container || e.stdin_closed) {  // the optional fields, when set
      out.pop_back();
      if (!e.task.empty()) out += fmt::format(R"(,"task":{})", host::json_string(e.task));
      if (e.container) out += fmt::format(R"(,"container":true,"bundle":{})", host::json_string(e.bundle));
      if (e.stdin_closed) out += R"(,"stdin_closed":true)";
      out += "}";
    }
  }
  return out + "]}\n";
}

host::Result<std::vector<ExecEntry>> parse_exec_journal(std::string_view json) {
  constexpr std::string_view kFile = "nesinit-execs.json";
  if (json.size() > kExecJournalMax) return host::Error{fmt::format("{}: over {} bytes", kFile, kExecJournalMax)};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return host::Error{fmt::format("{}: expected a JSON object", kFile)};
  std::uint64_t u = 0;
  if (o["schema_version"].get_uint64().get(u) || u != 1)
    return host::Error{fmt::format("{}: schema_version: expected 1", kFile)};
  simdjson::dom::array a;
  if (o["execs"].get_array().get(a)) return host::Error{fmt::format("{}: execs: expected an array", kFile)};
  std::vector<ExecEntry> out;
  std::set<std::tuple<std::string, std::string, bool>> ids;
  std::size_t i = 0;
  if (a.size() > kExecJournalEntriesMax)
    return host::Error{fmt::format("{}: execs: over {} entries ({})", kFile, kExecJournalEntriesMax, a.size())};
  for (simdjson::dom::element el : a) {
    auto bad = [&](std::string_view field, std::string_view want) {
      return host::Error{fmt::format("{}: execs[{}].{}: expected {}", kFile, i, field, want)};
    };
    simdjson::dom::object x;
    if (el.get_object().get(x)) return bad("", "an object");
    ExecEntry e;
    std::string_view s;
    if (x["id"].get_string().get(s) || s.empty() || s.size() > 256) return bad("id", "1..256 bytes");
    e.id = std::string(s);
    if (auto t = x["task"]; t.error() != simdjson::NO_SUCH_FIELD) {
      if (t.get_string().get(s) || s.size() > 256) return bad("task", "a container id of at most 256 bytes");
      e.task = std::string(s);
    }
    if (auto c = x["container"]; c.error() != simdjson::NO_SUCH_FIELD && c.get_bool().get(e.container))
      return bad("container", "a boolean");
    if (auto c = x["stdin_closed"]; c.error() != simdjson::NO_SUCH_FIELD && c.get_bool().get(e.stdin_closed))
      return bad("stdin_closed", "a boolean");
    if (e.container) {
      if (!e.task.empty()) return bad("task", "none for a container");
      if (x["bundle"].get_string().get(s) || (!s.empty() && s.front() != '/'))
        return bad("bundle", "an absolute path (or empty once deleted)");
      e.bundle = std::string(s);
    }
    if (!ids.insert({e.task, e.id, e.container}).second)
      return bad("id", fmt::format("an id not given before ('{}' is)", e.id));
    for (auto [name, field] : {std::pair{"spec", &e.spec}, {"stdin", &e.stdin_path}, {"stdout", &e.stdout_path},
                               {"stderr", &e.stderr_path}}) {
      if (x[name].get_string().get(s)) return bad(name, "a string");
      *field = std::string(s);
    }
    if (x["terminal"].get_bool().get(e.terminal)) return bad("terminal", "a boolean");
    if (x["state"].get_string().get(s)) return bad("state", "a string");
    bool known = false;
    for (ExecState st : kStates)
      if (to_string(st) == s) {
        e.state = st;
        known = true;
      }
    if (!known) return bad("state", "one of added, starting, running, stopped, deleted");
    if (e.container && e.bundle.empty() && e.state != ExecState::deleted) return bad("bundle", "an absolute path");
    if (x["proc"].get_uint64().get(u) || u > 0xffff) return bad("proc", "an integer 0..65535");
    e.proc = static_cast<std::uint16_t>(u);
    if (x["pid"].get_uint64().get(u) || u > 0x7fffffff) return bad("pid", "a pid or 0");
    e.pid = static_cast<std::uint32_t>(u);
    if (x["exit_status"].get_uint64().get(u) || u > 0xffffffffu) return bad("exit_status", "a u32");
    e.exit_status = static_cast<std::uint32_t>(u);
    if (x["exited_at_ns"].get_int64().get(e.exited_at_ns)) return bad("exited_at_ns", "an integer");
    if (e.state == ExecState::running && (e.proc == 0 || e.pid == 0))
      return bad("proc", "the monitor's number and a pid for a running exec");
    out.push_back(std::move(e));
    ++i;
  }
  return out;
}


// ---- save and restore ----

namespace {

/// The journal's entry for process `x` as the shim knows it now.
ExecEntry entry_of(const Shim& shim, const ExecProc& x, const Container* c) {
  ExecEntry e;
  e.id = x.id;
  if (x.phase == Phase::created) e.spec = x.spec_json;
  e.stdin_path = x.stdin_path;
  e.stdout_path = x.stdout_path;
  e.stderr_path = x.stderr_path;
  e.terminal = x.terminal;
  e.stdin_closed = x.stdin_closed;
  if (x.task != shim.cfg.id && x.exec) e.task = x.task;
  if (!x.exec) {
    e.container = true;
    e.bundle = c->bundle.string();
  }
  e.state = x.phase == Phase::running   ? ExecState::running
            : x.phase == Phase::stopped ? ExecState::stopped
            : x.start_respond           ? ExecState::starting
                                        : ExecState::added;
  e.proc = x.proc;
  e.pid = x.pid;
  e.exit_status = x.exit_status;
  e.exited_at_ns = x.exited_at_ns;
  return e;
}

/// The newest kExecReceiptsKept receipts of processes that are gone, newest first.
std::vector<ExecEntry> receipt_entries(Shim& shim) {
  std::vector<ExecEntry> deleted;
  const auto& order = shim.receipts.order;
  for (auto it = order.rbegin(); it != order.rend() && deleted.size() < kExecReceiptsKept; ++it) {
    if (shim.find(*it)) continue;
    const containerd::task::v2::DeleteResponse& r = shim.receipts.by_key.at(*it);
    ExecEntry e;
    // (task, exec id): an exec of the task or of a pod's container; (container, ""): a container.
    if (it->second.empty()) {
      e.id = it->first;
      e.container = true;
    } else {
      e.id = it->second;
      if (it->first != shim.cfg.id) e.task = it->first;
    }
    e.state = ExecState::deleted;
    e.pid = r.pid();
    e.exit_status = r.exit_status();
    e.exited_at_ns = ns_of(r.exited_at());
    deleted.push_back(std::move(e));
  }
  return deleted;
}

}  // namespace

host::Status save_exec_journal(Shim& shim, std::string_view point) {
  // A pod's sandbox deleted before its containers: its bundle, the journal's home, is
  // containerd's to remove once that Delete answered (no replacement shim can restore the pod
  // from it); each remaining container's receipt is written in its own bundle before its
  // Delete answers, which is what `shim delete` and a retry read.
  if (shim.own().task.phase == Phase::deleted) return host::Ok{};
  // In (task, exec id) order: a pod's container (its own process first), then its execs.
  std::vector<ExecEntry> out;
  for (const auto& [id, c] : shim.containers) {
    if (!c->own) out.push_back(entry_of(shim, *c->init, c.get()));
    for (const auto& [eid, x] : c->execs) out.push_back(entry_of(shim, *x, c.get()));
  }
  std::vector<ExecEntry> deleted = receipt_entries(shim);
  // Within what restore reads (kExecJournalEntriesMax, kExecJournalMax): the oldest receipts
  // go first; a journal of live processes alone over the bounds is an error (the call that
  // would add one fails).
  const std::size_t live = out.size();
  out.insert(out.end(), std::make_move_iterator(deleted.rbegin()), std::make_move_iterator(deleted.rend()));
  std::string text = encode_exec_journal(out);
  while ((out.size() > kExecJournalEntriesMax || text.size() > kExecJournalMax) && out.size() > live) {
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(live));
    text = encode_exec_journal(out);
  }
  if (out.size() > kExecJournalEntriesMax || text.size() > kExecJournalMax)
    return host::Error{fmt::format("{}: {} processes, {} bytes: over its bounds ({} entries, {} bytes)", kExecJournalFile,
                                   out.size(), text.size(), kExecJournalEntriesMax, kExecJournalMax)};
  return write_durable_at(point, shim.cfg.bundle, kExecJournalFile, text);
}

namespace {

/// A pod's container from its journal entry `e` (its record and config.json in its bundle say
/// what Create made): added to `shim`, or its receipt kept when its Delete removed the record
/// (the receipt written first) before the journal said so. null: kept as a receipt, or not
/// restored (a warning names why).
ExecProc* restore_container(Shim& shim, const ExecEntry& e, const ProcKey& k) {
  if (shim.containers.count(e.id)) {  // the sandbox's own id: never a container of its pod
    log("warning: task {}: container {}: the id of a task this shim serves already", shim.cfg.id, e.id);
    return nullptr;
  }
  const std::filesystem::path bundle = e.bundle;
  auto crec = load_task_record(bundle);
  auto text = read_oci_config(bundle);
  auto sp = text ? parse_oci_spec(*text, bundle) : host::Result<TaskSpec>(text.error());
  if (crec && !*crec) {
    if (auto c = load_receipt(bundle)) {
      shim.receipts.keep(k, receipt_response(static_cast<std::uint32_t>(c->pid), c->exit_status, c->exited_at_ns));
      return nullptr;
    }
  }
  if (!crec || !*crec || !(*crec)->container || !sp) {
    log("warning: task {}: container {}: its bundle {}: {}", shim.cfg.id, e.id, e.bundle,
        !crec                                 ? crec.error().message
        : !*crec || !(*crec)->container ? "no container record"
                                              : sp.error().message);
    return nullptr;
  }
  auto c = std::make_unique<Container>(shim, e.id, false);
  c->bundle = bundle;
  c->rec = std::move(**crec);
  c->guest_root = fmt::format("{}/{}/rootfs", kPodShareGuest, vm_id(shim.cfg.ns, e.id));
  if (!sp->hostname.empty()) c->hostname = sp->hostname;
  else if (!shim.own().spec.hostname.empty()) c->hostname = shim.own().spec.hostname;
  c->init = std::make_unique<ExecProc>(shim, e.id, std::string());
  c->init->spec = std::move(*sp);
  ExecProc* x = c->init.get();
  shim.containers.emplace(e.id, std::move(c));
  return x;
}

/// An exec from its journal entry `e`, added to its container in `shim`; null: not restored (a
/// warning names why).
ExecProc* restore_exec(Shim& shim, ExecEntry& e, const std::string& task_id) {
  Container* c = task_id == shim.cfg.id ? &shim.own() : shim.pod_container(task_id);
  if (!c) {
    log("warning: task {}: exec {}: its container {} is not restored", shim.cfg.id, e.id, task_id);
    return nullptr;
  }
  auto x = std::make_unique<ExecProc>(shim, task_id, e.id);
  if (e.state == ExecState::added) {
    auto sp = parse_oci_process(e.spec);
    if (!sp) {  // nothing ran: as if never added
      log("warning: task {}: exec {}: spec: {}", shim.cfg.id, e.id, sp.error().message);
      return nullptr;
    }
    x->spec = std::move(*sp);
    x->spec_json = std::move(e.spec);
  }
  ExecProc* xp = x.get();
  c->execs.emplace(e.id, std::move(x));
  return xp;
}

/// Process `x` as entry `e` says (its stdio, its number, its state); a running one is added to
/// `to_wait`.
void take_over(ExecProc& x, const ExecEntry& e, const std::string& what, std::vector<ProcKey>& to_wait) {
  x.stdin_path = e.stdin_path;
  x.stdout_path = e.stdout_path;
  x.stderr_path = e.stderr_path;
  x.terminal = e.terminal;
  x.stdin_closed = e.stdin_closed;
  x.restored = true;
  x.pid = e.pid;
  x.proc = e.proc;
  switch (e.state) {
    case ExecState::added: break;
    case ExecState::starting:
      log("warning: task {}: {}: the shim before this one died while starting it (its Start failed); "
          "stopped with 125",
          x.shim.cfg.id, what);
      x.stop(125, now_ns());
      break;
    case ExecState::stopped: x.stop(e.exit_status, e.exited_at_ns); break;
    case ExecState::running:
      x.phase = Phase::running;
      if (!x.stdin_path.empty() && !x.stdin_closed) x.hold_stdin();  // the monitor holds the read end
      to_wait.push_back(x.key());
      break;
    case ExecState::deleted: break;
  }
}

}  // namespace

std::string restore_exec_journal(Shim& shim) {
  const std::string& own_id = shim.cfg.id;
  auto text = base::read_small_file((shim.cfg.bundle / kExecJournalFile).c_str(), kExecJournalMax);
  if (!text) {
    if (text.error().err != ENOENT) log("warning: task {}: {}: execs not restored", own_id, text.error().message);
    return {};
  }
  auto j = parse_exec_journal(*text);
  if (!j) {
    log("warning: task {}: {}: execs not restored", own_id, j.error().message);
    return {};
  }
  // Every exec and receipt first, the journal written once, then the waits: an exec that
  // cannot be waited for ends (and journals) with everything else already in place.
  std::string out;
  std::vector<ProcKey> to_wait;
  // Two passes: a pod's live containers first (an exec joins its container's process), then
  // everything else in the journal's order (its receipts oldest first, as they were kept).
  std::vector<ExecEntry*> order;
  for (auto& e : *j)
    if (e.container && e.state != ExecState::deleted) order.push_back(&e);
  for (auto& e : *j)
    if (!e.container || e.state == ExecState::deleted) order.push_back(&e);
  for (ExecEntry* ep : order) {
    ExecEntry& e = *ep;
    if (e.task == own_id) e.task.clear();  // the shim's own task, however written
    const std::string task_id = e.container ? e.id : e.task.empty() ? own_id : e.task;
    const std::string what = e.container      ? fmt::format("container {}", e.id)
                             : e.task.empty() ? e.id
                                              : fmt::format("{} (in {})", e.id, e.task);
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", what, to_string(e.state));
    const ProcKey k{task_id, e.container ? std::string() : e.id};
    if (shim.find(k) || shim.receipts.by_key.count(k)) {  // a journal that names one process twice
      log("warning: task {}: {} named twice in the exec journal", own_id, what);
      continue;
    }
    if (e.state == ExecState::deleted) {
      shim.receipts.keep(k, receipt_response(e.pid, e.exit_status, e.exited_at_ns));
      continue;
    }
    ExecProc* x = e.container ? restore_container(shim, e, k) : restore_exec(shim, e, task_id);
    if (x) take_over(*x, e, what, to_wait);
  }
  shim.note_execs("journal:restore");  // as taken over (a `starting` one now stopped, with its time)
  for (const ProcKey& k : to_wait)
    if (ExecProc* x = shim.find(k)) x->wait_end();
  return out;
}

}  // namespace nes::shim
