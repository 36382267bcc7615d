#include "host/image/load.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <set>

#include <simdjson.h>

#include <fmt/format.h>

#include "host/image/entry_name.hpp"
#include "host/image/reference.hpp"

namespace nes::image {

namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kMaxEntries = 100000;
constexpr std::uint64_t kMaxDoc = 4 << 20;

struct Staged {
  fs::path path;
  Digest digest;
  std::uint64_t size = 0;
};

struct ArchiveCloser {
  void operator()(struct archive* a) const { archive_read_free(a); }
};

/// `raw` made relative and clean; a ".." drops the component before it (nothing above the root).
std::string clean_name(std::string_view raw) { return *clean_entry_name(raw, true); }

/// The archive, staged: every regular file under `dir` by number, hashed; symlinks remembered.
class Stage {
 public:
  Stage(fs::path dir, std::string what) : dir_(std::move(dir)), what_(std::move(what)) {}

  Status read(int fd) {
    std::unique_ptr<struct archive, ArchiveCloser> a(archive_read_new());
    archive_read_support_filter_all(a.get());
    archive_read_support_format_tar(a.get());
    archive_read_support_format_empty(a.get());  // an empty input: an archive with nothing in it
    if (archive_read_open_fd(a.get(), fd, 1 << 17) != ARCHIVE_OK) return fail(a.get(), "cannot read it as a tar archive");
    std::uint64_t n = 0;
    for (;;) {
      struct archive_entry* e;
      int r = archive_read_next_header(a.get(), &e);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return fail(a.get(), "corrupt or truncated archive");
      if (++n > kMaxEntries) return Error{fmt::format("{}: more than {} entries", what_, kMaxEntries)};
      const char* pn = archive_entry_pathname(e);
      std::string name = clean_name(pn ? pn : "");
      if (archive_entry_filetype(e) == AE_IFLNK) {
        const char* t = archive_entry_symlink(e);
        auto slash = name.rfind('/');
        std::string base = slash == std::string::npos ? std::string() : name.substr(0, slash + 1);
        links_[name] = clean_name(base + (t ? t : ""));
        continue;
      }
      if (archive_entry_filetype(e) != AE_IFREG || name.empty()) continue;
      Staged s;
      s.path = dir_ / std::to_string(n);
      host::Fd out(::open(s.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!out) return host::errno_error(errno, fmt::format("{}: staging {}", what_, name));
      vm::Sha256 h;
      const void* buf;
      size_t size;
      la_int64_t off;
      for (;;) {
        int rr = archive_read_data_block(a.get(), &buf, &size, &off);
        if (rr == ARCHIVE_EOF) break;
        if (rr != ARCHIVE_OK && rr != ARCHIVE_WARN)
          return fail(a.get(), fmt::format("corrupt or truncated archive (in '{}')", name));
        if (static_cast<std::uint64_t>(off) != s.size) return Error{fmt::format("{}: '{}': sparse entries are not image blobs", what_, name)};
        const char* p = static_cast<const char*>(buf);
        size_t left = size;
        while (left > 0) {
          ssize_t w = ::write(out.get(), p, left);
          if (w < 0 && errno == EINTR) continue;
          if (w < 0) return host::errno_error(errno, fmt::format("{}: staging '{}'", what_, name));
          p += w;
          left -= static_cast<size_t>(w);
        }
        h.update(std::as_bytes(std::span(static_cast<const char*>(buf), size)));
        s.size += size;
      }
      s.digest = sha256_digest(h);
      files_[name] = std::move(s);
    }
    return Ok{};
  }

  const Staged* find(std::string name) const {
    name = clean_name(name);
    for (int i = 0; i < 8; ++i) {
      if (auto it = files_.find(name); it != files_.end()) return &it->second;
      auto l = links_.find(name);
      if (l == links_.end()) return nullptr;
      name = l->second;
    }
    return nullptr;
  }

  Result<std::string> text(std::string_view name) const {
    const Staged* s = find(std::string(name));
    if (!s) return Error{fmt::format("{}: no {}", what_, name)};
    if (s->size > kMaxDoc) return Error{fmt::format("{}: {} larger than {} bytes", what_, name, kMaxDoc)};
    host::Fd fd(::open(s->path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return host::errno_error(errno, fmt::format("{}: {}", what_, name));
    std::string out(s->size, '\0');
    size_t got = 0;
    while (got < out.size()) {
      ssize_t r = ::read(fd.get(), out.data() + got, out.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return host::errno_error(r < 0 ? errno : EIO, fmt::format("{}: {}", what_, name));
      got += static_cast<size_t>(r);
    }
    return out;
  }

  const std::string& what() const { return what_; }

 private:
  Error fail(struct archive* a, std::string_view why) {
    const char* m = archive_error_string(a);
    return Error{fmt::format("{}: {}{}{}", what_, why, m ? ": " : "", m ? m : "")};
  }
  fs::path dir_;
  std::string what_;
  std::map<std::string, Staged> files_;
  std::map<std::string, std::string> links_;
};

/// A blob to ingest: the staged file that holds it.
struct Plan {
  std::vector<std::pair<Digest, const Staged*>> blobs;
  std::vector<std::pair<std::string, Descriptor>> refs;  // name -> manifest descriptor
  std::vector<Digest> untagged;
  std::vector<std::pair<Digest, std::string>> generated;  // documents we wrote (docker archives)
  void add(const Digest& d, const Staged* s) {
    for (auto& b : blobs)
      if (b.first == d) return;
    blobs.emplace_back(d, s);
  }
};

std::string_view sniff_layer(const Stage& st, const Staged& s) {
  host::Fd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
  unsigned char m[4] = {};
  if (fd && ::read(fd.get(), m, 4) == 4) {
    if (m[0] == 0x1f && m[1] == 0x8b) return media::kOciLayerGzip;
    if (m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) return media::kOciLayerZstd;
  }
  (void)st;
  return media::kOciLayer;
}

/// A ref name for `name` as an archive gives it, normalised ("busybox:latest" ->
/// docker.io/library/busybox:latest); an error naming it when it does not parse.
Result<std::string> ref_name(const Stage& st, std::string_view name) {
  auto r = parse_reference(name);
  if (!r) return Error{fmt::format("{}: image name '{}': {}", st.what(), name, r.error().message)};
  return r->str();
}

/// Plans the blobs of an OCI descriptor tree from the staged layout (blobs/sha256/HEX).
Status plan_oci(const Stage& st, const Descriptor& d, Plan& plan, std::string_view platform, int depth) {
  if (depth > 4) return Error{fmt::format("{}: indexes nested deeper than 4", st.what())};
  const Staged* s = st.find("blobs/sha256/" + d.digest.hex);
  if (!s) return Error{fmt::format("{}: blob {} is named but not in the archive", st.what(), d.digest.str())};
  if (s->digest != d.digest)
    return Error{fmt::format("{}: blob {}: its bytes hash to {}", st.what(), d.digest.str(), s->digest.str())};
  if (s->size != d.size)
    return Error{fmt::format("{}: blob {}: {} bytes, its descriptor says {}", st.what(), d.digest.str(), s->size, d.size)};
  plan.add(d.digest, s);
  bool index = d.media_type == media::kOciIndex || d.media_type == media::kDockerList;
  bool manifest = d.media_type == media::kOciManifest || d.media_type == media::kDockerManifest;
  if (!index && !manifest) return Ok{};
  auto text = st.text("blobs/sha256/" + d.digest.hex);
  if (!text) return text.error();
  std::string what = fmt::format("{}: manifest {}", st.what(), d.digest.str());
  if (index) {
    auto ix = parse_index(*text, what);
    if (!ix) return ix.error();
    auto sel = select_platform(*ix, platform, what);
    if (!sel) return sel.error();
    return plan_oci(st, *sel, plan, platform, depth + 1);  // the others may be absent: not planned
  }
  auto m = parse_manifest(*text, what);
  if (!m) return m.error();
  if (auto c = plan_oci(st, m->config, plan, platform, depth + 1); !c) return c;
  for (const auto& l : m->layers) {
    if (!is_layer_media_type(l.media_type))
      return Error{fmt::format("{}: layer {}: media type '{}' is not a layer this store unpacks", what, l.digest.str(), l.media_type)};
    if (auto c = plan_oci(st, l, plan, platform, depth + 1); !c) return c;
  }
  return Ok{};
}

Status plan_oci_layout(const Stage& st, Plan& plan, std::string_view platform) {
  auto index = st.text("index.json");
  if (!index) return index.error();
  auto ix = parse_index(*index, fmt::format("{}: index.json", st.what()));
  if (!ix) return ix.error();
  if (ix->manifests.empty()) return Error{fmt::format("{}: index.json names no image", st.what())};
  for (const auto& d : ix->manifests) {
    if (auto s = plan_oci(st, d, plan, platform, 0); !s) return s;
    std::string name;
    if (auto it = d.annotations.find("io.containerd.image.name"); it != d.annotations.end()) name = it->second;
    else if (auto it2 = d.annotations.find(std::string(kRefNameAnnotation)); it2 != d.annotations.end()) name = it2->second;
    Descriptor plain{d.media_type, d.digest, d.size, {}, d.platform};
    if (name.empty()) {
      plan.untagged.push_back(d.digest);
      plan.refs.emplace_back(untagged_ref_name(d.digest), plain);
      continue;
    }
    auto rn = ref_name(st, name);
    if (!rn) return rn.error();
    plan.refs.emplace_back(*rn, plain);
  }
  return Ok{};
}

Status plan_docker(const Stage& st, Plan& plan) {
  auto text = st.text("manifest.json");
  if (!text) return text.error();
  namespace sj = simdjson;
  std::string what = fmt::format("{}: manifest.json", st.what());
  sj::dom::parser p;
  sj::dom::array arr;
  if (p.parse(sj::padded_string(*text)).get(arr)) return Error{fmt::format("{}: not a JSON array", what)};
  size_t i = 0;
  for (auto item : arr) {
    std::string at = fmt::format("{}[{}]", what, i++);
    sj::dom::object o;
    if (item.get(o)) return Error{fmt::format("{}: not an object", at)};
    std::string_view cfg_name;
    if (o["Config"].get(cfg_name)) return Error{fmt::format("{}: field 'Config': missing or not a string", at)};
    const Staged* cfg = st.find(std::string(cfg_name));
    if (!cfg) return Error{fmt::format("{}: config '{}' is not in the archive", at, cfg_name)};
    auto cfg_text = st.text(cfg_name);
    if (!cfg_text) return cfg_text.error();
    auto config = parse_config(*cfg_text, fmt::format("{}: config '{}'", at, cfg_name));
    if (!config) return config.error();
    sj::dom::array layers;
    if (o["Layers"].get(layers)) return Error{fmt::format("{}: field 'Layers': missing or not an array", at)};
    std::string lj;
    size_t n = 0;
    for (auto l : layers) {
      std::string_view ln;
      if (l.get(ln)) return Error{fmt::format("{}: field 'Layers': not an array of strings", at)};
      const Staged* s = st.find(std::string(ln));
      if (!s) return Error{fmt::format("{}: layer '{}' is not in the archive", at, ln)};
      std::string_view mt = sniff_layer(st, *s);
      if (n >= config->diff_ids.size())
        return Error{fmt::format("{}: {} layers but the config has {} diff_ids", at, n + 1, config->diff_ids.size())};
      if (mt == media::kOciLayer && s->digest != config->diff_ids[n])
        return Error{fmt::format("{}: layer '{}' hashes to {}, the config's diff_id is {}", at, ln, s->digest.str(),
                                 config->diff_ids[n].str())};
      plan.add(s->digest, s);
      if (n) lj += ",";
      lj += descriptor_json(Descriptor{std::string(mt), s->digest, s->size, {}, {}});
      ++n;
    }
    if (n != config->diff_ids.size())
      return Error{fmt::format("{}: {} layers but the config has {} diff_ids", at, n, config->diff_ids.size())};
    plan.add(cfg->digest, cfg);
    std::string manifest = fmt::format(R"({{"schemaVersion":2,"mediaType":"{}","config":{},"layers":[{}]}})",
                                       media::kOciManifest,
                                       descriptor_json(Descriptor{std::string(media::kOciConfig), cfg->digest, cfg->size, {}, {}}), lj);
    Digest md = sha256_of(manifest);
    plan.generated.emplace_back(md, manifest);
    Descriptor desc{std::string(media::kOciManifest), md, manifest.size(), {}, {}};
    sj::dom::array tags;
    bool any = false;
    if (sj::dom::element te; o["RepoTags"].get(te) == sj::SUCCESS && !te.is_null()) {
      if (te.get(tags)) return Error{fmt::format("{}: field 'RepoTags': not an array", at)};
      for (auto t : tags) {
        std::string_view tag;
        if (t.get(tag)) return Error{fmt::format("{}: field 'RepoTags': not an array of strings", at)};
        auto rn = ref_name(st, tag);
        if (!rn) return rn.error();
        plan.refs.emplace_back(*rn, desc);
        any = true;
      }
    }
    if (!any) {
      plan.untagged.push_back(md);
      plan.refs.emplace_back(untagged_ref_name(md), desc);
    }
  }
  if (i == 0) return Error{fmt::format("{}: names no image", what)};
  return Ok{};
}

Status ingest_file(Store& store, const Digest& d, const Staged& s) {
  auto w = store.begin_blob(d, s.size);
  if (!w) return w.error();
  if (w->present()) return Ok{};
  host::Fd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return host::errno_error(errno, "staged blob");
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return host::errno_error(errno, "staged blob");
    if (r == 0) break;
    if (auto s2 = w->write(std::string_view(buf, static_cast<size_t>(r))); !s2) return s2;
  }
  auto c = w->commit();
  if (!c) return c.error();
  return Ok{};
}

}  // namespace

std::string untagged_ref_name(const Digest& manifest) { return manifest.str(); }

Result<Loaded> load_archive(Store& store, int fd, std::string_view what, std::string_view platform) {
  auto hold = store.hold();
  if (!hold) return hold.error();
  std::string tmpl = (store.root() / "ingest" / "load-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return host::errno_error(errno, fmt::format("load: mkdtemp in {}", (store.root() / "ingest").string()));
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmpl};
  Stage st(tmpl, std::string(what));
  if (auto r = st.read(fd); !r) return r.error();
  Plan plan;
  if (st.find("oci-layout") && st.find("index.json")) {
    if (auto p = plan_oci_layout(st, plan, platform); !p) return p.error();
  } else if (st.find("manifest.json")) {
    if (auto p = plan_docker(st, plan); !p) return p.error();
  } else {
    return Error{fmt::format("{}: neither a docker save archive (manifest.json) nor an OCI archive (oci-layout, index.json)", what)};
  }
  // everything checked: now into the store, documents last, names after them
  for (const auto& [d, s] : plan.blobs)
    if (auto r = ingest_file(store, d, *s); !r) return r.error();
  for (const auto& [d, text] : plan.generated) {
    auto w = store.begin_blob(d, text.size());
    if (!w) return w.error();
    if (auto r = w->write(text); !r) return r.error();
    if (auto c = w->commit(); !c) return c.error();
  }
  Loaded out;
  for (const auto& [name, desc] : plan.refs) {
    if (auto r = store.set_ref(name, desc); !r) return r.error();
    if (name.compare(0, 7, "sha256:") != 0) out.refs.push_back(name);
  }
  out.untagged = plan.untagged;
  return out;
}

}  // namespace nes::image
