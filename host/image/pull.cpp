// pull(): reference -> manifest -> blobs -> ref (pull.hpp).
#include "host/image/pull.hpp"

#include <cerrno>
#include <set>

#include <fmt/format.h>

namespace nes::image {
namespace {

/// Wraps a store/manifest error with the registry's name unless it names it already.
Error at(const Registry& reg, const Error& e) {
  if (e.message.starts_with("registry ")) return e;
  return Error{fmt::format("registry {}: {}", reg.host(), e.message), e.err};
}

/// A manifest fetched by digest must hash to it and have the size its descriptor says.
Status check_manifest(const Registry& reg, const FetchedManifest& fm, const Digest& want, std::optional<std::uint64_t> size,
                      std::string_view what) {
  Digest got = sha256_of(fm.body);
  if (got != want)
    return Error{fmt::format("registry {}: {}: digest mismatch: the registry sent {} ({} bytes)", reg.host(), what,
                             got.str(), fm.body.size())};
  if (size && *size != fm.body.size())
    return Error{fmt::format("registry {}: {}: size mismatch: {} bytes, its descriptor says {}", reg.host(), what,
                             fm.body.size(), *size)};
  return Ok{};
}


/// Steps 1 and 2: the image manifest REF names for the platform, checked (its descriptor in
/// `res.manifest`, REF's own digest in `res.resolved`), and its body.
Result<std::pair<Manifest, std::string>> resolve(Registry& reg, const Reference& ref, const PullOptions& opt,
                                                 PullResult& res) {
  // 1. The manifest REF names; by digest it must hash to that digest.
  const std::string want = ref.digest ? ref.digest->str() : ref.tag;
  const std::string what = fmt::format("manifest {}{}{}", ref.repository, ref.digest ? "@" : ":", want);
  auto fm = reg.get_manifest(ref.repository, want);
  if (!fm) return std::move(fm).error();
  res.resolved = sha256_of(fm->body);
  if (ref.digest) {
    if (auto st = check_manifest(reg, *fm, *ref.digest, std::nullopt, what); !st) return std::move(st).error();
  } else if (!fm->digest.empty() && fm->digest != res.resolved.str()) {
    return Error{fmt::format("registry {}: {}: digest mismatch: Docker-Content-Digest says {}, the body is {}",
                             reg.host(), what, fm->digest, res.resolved.str())};
  }

  // 2. An index or manifest list: the manifest for the platform, fetched by its digest.
  auto kind = sniff_document(fm->body, what);
  if (!kind) return at(reg, kind.error());
  std::string body = std::move(fm->body);
  Descriptor mdesc;
  if (*kind == DocKind::index) {
    auto idx = parse_index(body, what);
    if (!idx) return at(reg, idx.error());
    auto sel = select_platform(*idx, opt.platform, what);
    if (!sel) return at(reg, sel.error());
    std::string mwhat = fmt::format("manifest {}@{} ({})", ref.repository, sel->digest.str(), opt.platform);
    auto m = reg.get_manifest(ref.repository, sel->digest.str());
    if (!m) return std::move(m).error();
    if (auto st = check_manifest(reg, *m, sel->digest, sel->size, mwhat); !st) return std::move(st).error();
    mdesc.media_type = sel->media_type;
    mdesc.digest = sel->digest;
    mdesc.size = sel->size;
    mdesc.platform = sel->platform;
    body = std::move(m->body);
  } else {
    mdesc.media_type = fm->media_type;
    mdesc.digest = res.resolved;
    mdesc.size = body.size();
  }
  auto man = parse_manifest(body, what);
  if (!man) return at(reg, man.error());
  if (!man->media_type.empty()) mdesc.media_type = man->media_type;
  if (mdesc.media_type.empty()) mdesc.media_type = std::string(media::kOciManifest);
  for (std::size_t i = 0; i < man->layers.size(); ++i)
    if (!is_layer_media_type(man->layers[i].media_type))
      return Error{fmt::format("registry {}: {}: layer {} is {}, which neshost cannot unpack", reg.host(), what, i + 1,
                               man->layers[i].media_type)};
  res.manifest = mdesc;
  return std::pair<Manifest, std::string>{std::move(*man), std::move(body)};
}

/// Step 3: the config and the layers of `man` into the store (see pull.hpp).
Status download(Store& store, Registry& reg, const Reference& ref, const Manifest& man, const PullOptions& opt,
                PullResult& res) {
  // 3. Config and layers, each digest once (the caller holds the store against gc()).
  std::vector<BlobEvent> blobs;
  std::set<Digest> seen;
  auto plan = [&](const Descriptor& d, bool cfg) {
    if (!seen.insert(d.digest).second) return;
    BlobEvent e;
    e.index = blobs.size();
    e.digest = d.digest;
    e.size = d.size;
    e.is_config = cfg;
    e.state = store.has_blob(d.digest) ? BlobState::present : BlobState::downloading;
    if (e.state == BlobState::present) e.done = e.size;
    blobs.push_back(e);
  };
  plan(man.config, true);
  for (const auto& l : man.layers) plan(l, false);
  if (opt.on_plan) opt.on_plan(blobs);
  auto emit = [&](const BlobEvent& e) {
    if (opt.on_blob) opt.on_blob(e);
  };

  std::vector<std::optional<BlobWriter>> writers(blobs.size());
  std::vector<std::size_t> later;  // another writer has them in flight
  auto make_jobs = [&](const std::vector<std::size_t>& which, bool wait, std::vector<BlobJob>& jobs) -> Status {
    for (std::size_t i : which) {
      BlobEvent& e = blobs[i];
      auto w = store.begin_blob(e.digest, e.size, wait);
      if (!w && w.error().err == EWOULDBLOCK) {
        e.state = BlobState::waiting;
        emit(e);
        later.push_back(i);
        continue;
      }
      if (!w) return at(reg, w.error());
      if (w->present()) {  // committed meanwhile (by the writer we waited for)
        e.state = BlobState::present;
        e.done = e.size;
        ++res.blobs_present;
        emit(e);
        continue;
      }
      writers[i].emplace(std::move(*w));
      BlobJob j;
      j.digest = e.digest.str();
      j.size = e.size;
      j.write = [&, i](std::span<const std::byte> b) { return writers[i]->write(b); };
      j.finish = [&, i]() -> Status {
        auto c = writers[i]->commit(false);  // the directory once, before the ref (pull())
        if (!c) return std::move(c).error();
        blobs[i].state = BlobState::complete;
        blobs[i].done = blobs[i].size;
        ++res.blobs_fetched;
        res.bytes_fetched += blobs[i].size;
        emit(blobs[i]);
        writers[i].reset();
        return Ok{};
      };
      j.progress = [&, i](std::uint64_t done, std::uint64_t) {
        blobs[i].done = done;
        emit(blobs[i]);
      };
      jobs.push_back(std::move(j));
    }
    return Ok{};
  };

  std::vector<std::size_t> todo;
  for (auto& e : blobs) {
    if (e.state == BlobState::present) ++res.blobs_present;
    else todo.push_back(e.index);
  }
  for (int round = 0; round < 2 && !todo.empty(); ++round) {
    // Round 0: every blob no other writer holds; round 1: those, after waiting for that writer
    // (it committed them: present; or it gave up: ours to download).
    std::vector<BlobJob> jobs;
    later.clear();
    if (auto st = make_jobs(todo, round == 1, jobs); !st) return std::move(st).error();
    if (!jobs.empty()) {
      auto st = reg.fetch_blobs(ref.repository, jobs, opt.parallel, opt.cancel);
      if (!st) return std::move(st).error();
    }
    todo = later;
    if (opt.cancel && opt.cancel->load())
      return Error{fmt::format("registry {}: interrupted", reg.host()), EINTR};
  }

  return Ok{};
}

}  // namespace

Result<PullResult> pull(Store& store, const Reference& ref, const PullOptions& opt) {
  Registry reg(ref.api_host(), opt.tls, opt.credential);
  PullResult res;
  res.ref_name = ref.str();
  auto resolved = resolve(reg, ref, opt, res);
  if (!resolved) return std::move(resolved).error();
  const Manifest& man = resolved->first;
  const std::string& body = resolved->second;
  const Descriptor& mdesc = res.manifest;
  // Under the store's hold from the first blob to the ref, so that a gc() cannot take blobs no
  // ref names yet.
  auto hold = store.hold();
  if (!hold) return std::move(hold).error();
  if (auto st = download(store, reg, ref, man, opt, res); !st) return std::move(st).error();

  // 4. The manifest blob, then the ref: the pull's commit point.
  auto mw = store.begin_blob(mdesc.digest, mdesc.size);
  if (!mw) return at(reg, mw.error());
  if (!mw->present()) {
    if (auto st = mw->write(body); !st) return at(reg, st.error());
    if (auto c = mw->commit(false); !c) return at(reg, c.error());
  }
  // Every blob's link durable (one fsync of blobs/sha256 for all of them, and for any another
  // writer committed that we found present) before index.json names them.
  if (auto st = store.sync_blobs(); !st) return at(reg, st.error());
  Descriptor named = mdesc;
  named.platform.reset();
  if (auto st = store.set_ref(res.ref_name, named); !st) return std::move(st).error();
  return res;
}

}  // namespace nes::image
