// `neshost load`, `images`, `rmi`, `tag`, `image inspect|prune|ls|rm|load|tag`: the image store
// (host/image/, docs/images.md). Errors exit 125 naming what failed, usage errors 2.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#include <string>

#include <fmt/format.h>

#include "host/cli/image.hpp"

#include "host/cli/cli.hpp"
#include "host/cli/flags.hpp"
#include "host/image/block_root.hpp"
#include "host/image/catalog.hpp"
#include "host/image/load.hpp"
#include "host/image/run_image.hpp"
#include "host/image/unpack.hpp"
#include "host/lib/state_dir.hpp"

namespace nes::cli {

namespace {
/// A small file of the unpacked root (its /etc/passwd, /etc/group), read without following a
/// symlink out of it: "" when absent or not a regular file.
std::string root_file(const std::filesystem::path& root, const char* rel) {
  host::Fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return {};
  host::Fd f(::openat(dir.get(), rel, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!f) return {};
  std::string out(1 << 20, '\0');
  ssize_t n = ::read(f.get(), out.data(), out.size());
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}
}  // namespace

host::Result<bool> apply_run_image(RunFlags& o, const std::filesystem::path& state, const std::string& vm,
                                   std::optional<std::filesystem::path>& rootfs_dir) {
  namespace im = nes::image;
  namespace fs = std::filesystem;
  if (o.argv_after_dashdash == 0 || o.rootfs || o.argv.empty() || o.sandbox || o.snapshot) return false;
  const std::string word = o.argv.front();
  auto ref = im::parse_reference(word);
  if (!ref) return false;
  // A word with a registry, a tag or a digest names an image even when absent; with --pull always
  // any first word does (docker's reading).
  const bool always = o.pull == RunFlags::Pull::always;
  const bool explicit_ref = always || word.find_first_of(":/@") != std::string::npos;
  auto pull = [&]() -> host::Status {
    if (auto p = pull_for_run(state, *ref); !p) return host::Error{fmt::format("image {}: {}", word, p.error().message)};
    return host::Ok{};
  };
  if (always)
    if (auto p = pull(); !p) return p.error();
  // The store (a path: each lookup reads index.json anew, so one opened before a pull sees it).
  std::optional<im::Store> store;
  im::Descriptor mdesc;
  auto find = [&]() -> host::Result<std::optional<im::Manifest>> {
    if (!store) {
      if (!im::Store::exists(state)) return std::optional<im::Manifest>{};  // no store: nothing made for `run sh`
      auto s = im::Store::open(state);
      if (!s) return host::Error{s.error().message};
      store.emplace(std::move(*s));
    }
    auto m = im::resolve_manifest(*store, ref->str(), "linux/amd64", &mdesc);
    if (m) return std::optional<im::Manifest>{std::move(*m)};
    if (m.error().err != ENOENT) return host::Error{fmt::format("image {}: {}", word, m.error().message)};
    return std::optional<im::Manifest>{};
  };
  auto found = find();
  if (found && !*found && explicit_ref && o.pull == RunFlags::Pull::missing) {
    if (auto p = pull(); !p) return p.error();
    found = find();
  }
  if (!found) return found.error();
  if (!*found) {
    if (!explicit_ref) return false;
    return host::Error{fmt::format("image {}: not in the store ({}): neshost pull {}, or neshost load", word,
                                   state.string(), word)};
  }
  auto m = &**found;
  o.image = ref->str();
  auto cfg_text = store->read_blob(m->config.digest, 4 << 20);
  if (!cfg_text) return host::Error{fmt::format("image {}: {}", word, cfg_text.error().message)};
  auto cfg = im::parse_config(*cfg_text, fmt::format("image {}: config", word));
  if (!cfg) return cfg.error();
  auto root = im::unpack_image(*store, *m);
  if (!root) return host::Error{fmt::format("image {}: unpack: {}", word, root.error().message)};
  im::RunOverrides over;
  over.entrypoint = o.entrypoint;
  over.args.assign(o.argv.begin() + 1, o.argv.end());
  over.env = o.env;
  over.workdir = o.workdir;
  over.user = o.user_spec;
  auto spec = im::resolve_run(*cfg, over, root_file(*root, "etc/passwd"), root_file(*root, "etc/group"));
  if (!spec) return host::Error{fmt::format("image {}: {}", word, spec.error().message)};
  o.argv = spec->argv;
  o.env = spec->env;
  o.workdir = spec->workdir;
  o.uid = spec->uid;
  o.gid = spec->gid;
  o.groups.insert(o.groups.begin(), spec->groups.begin(), spec->groups.end());
  // the VM's dir, as run makes it (0700, never through a symlink), and what it runs
  if (auto d = host::open_vm_dir(state, vm, true); !d) return host::Error{fmt::format("--state: {}", d.error().message)};
  const fs::path vm_dir = state / vm;
  std::string rec = fmt::format(R"({{"ref":{},"config":"{}","manifest":"{}"}})" "\n", im::json_quote(*o.image),
                                m->config.digest.str(), mdesc.digest.str());
  if (auto w = im::write_file_durable(vm_dir / im::kVmImageFile, rec, 0600); !w) return w.error();
  if (o.rootfs_block) {
    // --rootfs-mode block: the image's EROFS file (built once per image config, shared by every
    // VM of it, verified against its recorded digest before this boot) as a read-only disk; the
    // writable layer is the guest's (docs/vm.md "Block devices").
    auto br = im::ensure_block_root(*store, m->config.digest.str());
    if (!br) return host::Error{fmt::format("image {}: block root: {}", word, br.error().message)};
    if (auto v = im::verify_block_root(*br); !v) return host::Error{fmt::format("image {}: {}", word, v.error().message)};
    o.rootfs = br->path;
    return true;
  }
  if (o.read_only) {
    o.rootfs = *root;
  } else {
    std::string tmpl = (vm_dir / "rootfs.XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return host::errno_error(errno, fmt::format("image {}: writable layer in {}", word, vm_dir.string()));
    const fs::path layer = tmpl;
    for (const char* sub : {"upper", "work", "merged"})
      if (::mkdir((layer / sub).c_str(), 0755) != 0) return host::errno_error(errno, fmt::format("image {}: mkdir {}", word, (layer / sub).string()));
    vm::OverlayRoot ov{*root, layer / "upper", layer / "work"};
    for (const auto& p : {ov.lower, ov.upper, ov.work})
      if (p.native().find_first_of(",:") != std::string::npos)
        return host::Error{fmt::format("image {}: path '{}' has a ',' or ':' (overlayfs options cannot carry it)", word, p.string())};
    o.rootfs_overlay = ov;
    o.rootfs = layer / "merged";
  }
  std::error_code ec;
  rootfs_dir = fs::canonical(*o.rootfs, ec);
  return true;
}

namespace {

namespace fs = std::filesystem;
namespace im = nes::image;

constexpr int kExitFail = 125;

constexpr std::string_view kLoadHelp = R"(usage: neshost load [-i FILE|-] [-q] [--state DIR]

Loads images from an archive into the store (STATE/.images): `docker save` / `skopeo copy …
docker-archive:FILE` archives (manifest.json) and OCI archives (`skopeo copy … oci-archive:FILE`:
oci-layout, index.json), plain or gzip/zstd/xz-compressed; from FILE, or stdin without -i or with
`-i -`. Every blob is checked against its digest before anything becomes visible; a truncated or
corrupt archive changes nothing. Prints "Loaded image: NAME" per name (-q: nothing).
Exit: 0, 2 usage, 125 the archive could not be loaded (the store unchanged).
)";

constexpr std::string_view kImagesHelp = R"(usage: neshost images [-q] [--no-trunc] [--state DIR]

Lists the store's images: REPOSITORY TAG IMAGE ID CREATED SIZE (SIZE: the stored, compressed
blobs). -q: the image IDs only, one per image.
)";

constexpr std::string_view kRmiHelp = R"(usage: neshost rmi [-f] [--state DIR] IMAGE...

Removes each IMAGE (a name: that tag only; an image ID: every tag of it, which needs -f when it has
several), then the blobs and unpacked roots no image needs any more. Refused, naming the VM, while a
VM (any state dir with its image.json; `neshost rm VM` first) uses the image.
Exit: 0, 2 usage, 125 an IMAGE not found or refused (the others are still removed).
)";

constexpr std::string_view kTagHelp = R"(usage: neshost tag [--state DIR] SOURCE TARGET

Names image SOURCE (a name or an image ID) TARGET too (docker's normalisation: `app` is
docker.io/library/app:latest).
)";

constexpr std::string_view kImageHelp = R"(usage: neshost image inspect [--state DIR] IMAGE...
       neshost image prune [-a] [-f] [--state DIR]
       neshost image ls|rm|load|tag ...   (as images, rmi, load, tag)

inspect: each IMAGE as JSON (docker's shape: Id, RepoTags, Created, Architecture, Os, Config,
RootFS, Size; and Manifest, the manifest's digest), one array.
prune: removes untagged images (-a: every image no VM uses), then the blobs and unpacked roots
nothing needs. -f is accepted (there is no prompt).
)";

fs::path state_of(const Parsed& p) {
  auto s = p.get("state");
  return s ? fs::path(*s) : default_state_dir();
}

int fail(std::string_view cmd, std::string_view msg) {
  fmt::print(stderr, "neshost {}: {}\n", cmd, msg);
  return kExitFail;
}

std::string shown_name(const im::ImageEntry& e, bool with_tag = true) {
  if (!e.ref) return "<none>";
  return with_tag ? e.ref->familiar() : e.ref->familiar_name();
}

std::string human_size(std::uint64_t b) {  // docker's: decimal units, 3 significant digits
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{}B", b) : fmt::format("{:.3g}{}", v, units[u]);
}

/// "N units ago" from an RFC 3339 time ("" or unparsable: "N/A").
std::string ago(std::string_view created) {
  std::tm tm{};
  std::string s(created.substr(0, 19));
  if (s.size() < 19 || !::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return "N/A";
  std::time_t t = ::timegm(&tm);
  auto d = std::time(nullptr) - t;
  if (d < 0) d = 0;
  struct { long secs; const char* unit; } steps[] = {{365L * 86400, "year"}, {30L * 86400, "month"}, {7L * 86400, "week"},
                                                     {86400, "day"}, {3600, "hour"}, {60, "minute"}, {1, "second"}};
  for (auto st : steps)
    if (d >= st.secs) {
      long n = static_cast<long>(d / st.secs);
      return fmt::format("{} {}{} ago", n, st.unit, n == 1 ? "" : "s");
    }
  return "Less than a second ago";
}

int load_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"input", true, "-i"}, {"quiet", false, "-q"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("load", p.error().message);
  if (p->help) { fmt::print("{}", kLoadHelp); return 0; }
  if (!p->positional.empty()) return usage_error("load", fmt::format("unexpected argument '{}'", p->positional[0]));
  std::string in = p->get("input").value_or("-");
  host::Fd file;
  int fd = 0;
  std::string what = "stdin";
  if (in != "-") {
    file.reset(::open(in.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file) return fail("load", fmt::format("--input {}: {}", in, std::strerror(errno)));
    fd = file.get();
    what = in;
  } else if (::isatty(0)) {
    return usage_error("load", "stdin is a terminal: give an archive with -i FILE or on stdin");
  }
  auto store = im::Store::open(state_of(*p));
  if (!store) return fail("load", store.error().message);
  auto r = im::load_archive(*store, fd, what);
  if (!r) return fail("load", r.error().message);
  if (!p->has("quiet")) {
    for (const auto& n : r->refs) fmt::print("Loaded image: {}\n", im::parse_reference(n) ? im::parse_reference(n)->familiar() : n);
    for (const auto& d : r->untagged) fmt::print("Loaded image ID: {}\n", d.str());
  }
  return 0;
}

int images_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"quiet", false, "-q"}, {"no-trunc", false}, {"all", false, "-a"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("images", p.error().message);
  if (p->help) { fmt::print("{}", kImagesHelp); return 0; }
  auto store = im::Store::open(state_of(*p));
  if (!store) return fail("images", store.error().message);
  auto all = im::list_images(*store);
  if (!all) return fail("images", all.error().message);
  bool full = p->has("no-trunc");
  auto id_of = [&](const im::ImageEntry& e) { return full ? e.config_digest.str() : e.config_digest.short_id(); };
  if (p->has("quiet")) {
    std::set<std::string> seen;
    for (const auto& e : *all)
      if (e.error.empty() && seen.insert(id_of(e)).second) fmt::print("{}\n", id_of(e));
    return 0;
  }
  std::vector<std::array<std::string, 5>> rows{{"REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"}};
  for (const auto& e : *all) {
    if (!e.error.empty()) {
      fmt::print(stderr, "neshost images: {}: {}\n", e.ref_name, e.error);
      continue;
    }
    std::string tag = e.ref ? (e.ref->tag.empty() ? "<none>" : e.ref->tag) : "<none>";
    rows.push_back({shown_name(e, false), tag, id_of(e), ago(e.config.created), human_size(e.size)});
  }
  std::array<size_t, 5> w{};
  for (const auto& r : rows)
    for (size_t i = 0; i < 5; ++i) w[i] = std::max(w[i], r[i].size());
  for (const auto& r : rows)
    fmt::print("{:<{}}   {:<{}}   {:<{}}   {:<{}}   {}\n", r[0], w[0], r[1], w[1], r[2], w[2], r[3], w[3], r[4]);
  return 0;
}

/// Removes blobs and roots nothing needs; prints what it freed on stderr when asked.
void collect(im::Store& store, const fs::path& state, std::string_view cmd, std::uint64_t* freed = nullptr) {
  auto keep = im::configs_in_use(state);
  auto g = store.gc(std::set<im::Digest>(keep.begin(), keep.end()));
  if (!g) {
    fmt::print(stderr, "neshost {}: blobs not removed now ({}): `neshost image prune` removes them later\n", cmd, g.error().message);
    return;
  }
  if (freed) *freed = g->bytes;
}

int rmi_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"force", false, "-f"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("rmi", p.error().message);
  if (p->help) { fmt::print("{}", kRmiHelp); return 0; }
  if (p->positional.empty()) return usage_error("rmi", "IMAGE is required");
  fs::path state = state_of(*p);
  auto store = im::Store::open(state);
  if (!store) return fail("rmi", store.error().message);
  int rc = 0;
  for (const auto& text : p->positional) {
    auto all = im::list_images(*store);
    if (!all) return fail("rmi", all.error().message);
    bool by_id = false;
    auto hits = im::match_images(*all, text, &by_id);
    if (hits.empty()) {
      rc = fail("rmi", fmt::format("no such image: {}", text));
      continue;
    }
    std::set<std::string> configs;
    for (auto* h : hits) configs.insert(h->config_digest.hex);
    if (configs.size() > 1) {
      rc = fail("rmi", fmt::format("'{}' matches {} images: give more of the ID", text, configs.size()));
      continue;
    }
    const im::Digest config = hits[0]->config_digest;
    size_t refs_of_image = 0;
    for (const auto& e : *all)
      if (e.error.empty() && e.config_digest == config) ++refs_of_image;
    if (by_id && hits.size() > 1 && !p->has("force")) {
      rc = fail("rmi", fmt::format("unable to delete {} (must be forced): the image is named {} times", config.short_id(), hits.size()));
      continue;
    }
    bool last = hits.size() == refs_of_image;
    if (last) {
      auto vms = im::vms_using(state, config);
      if (!vms.empty()) {
        std::string names;
        for (const auto& v : vms) names += (names.empty() ? "" : ", ") + v;
        rc = fail("rmi", fmt::format("image {} ({}) is used by VM {}: remove the VM first (neshost rm)", text, config.short_id(), names));
        continue;
      }
    }
    bool ok = true;
    for (auto* h : hits) {
      if (auto r = store->remove_ref(h->ref_name); !r) {
        rc = fail("rmi", r.error().message);
        ok = false;
        continue;
      }
      if (h->ref) fmt::print("Untagged: {}\n", h->ref->familiar());
    }
    if (ok && last) fmt::print("Deleted: {}\n", config.str());
  }
  collect(*store, state, "rmi");
  return rc;
}

int tag_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("tag", p.error().message);
  if (p->help) { fmt::print("{}", kTagHelp); return 0; }
  if (p->positional.size() != 2) return usage_error("tag", "SOURCE and TARGET are required");
  auto target = im::parse_reference(p->positional[1]);
  if (!target) return usage_error("tag", "TARGET: " + target.error().message);
  auto store = im::Store::open(state_of(*p));
  if (!store) return fail("tag", store.error().message);
  auto all = im::list_images(*store);
  if (!all) return fail("tag", all.error().message);
  auto hits = im::match_images(*all, p->positional[0]);
  if (hits.empty()) return fail("tag", fmt::format("no such image: {}", p->positional[0]));
  auto r = store->find_ref(hits[0]->ref_name);
  if (!r || !*r) return fail("tag", fmt::format("no such image: {}", p->positional[0]));
  im::Descriptor d = **r;
  d.annotations.erase(std::string(im::kRefNameAnnotation));
  if (auto s = store->set_ref(target->str(), d); !s) return fail("tag", s.error().message);
  return 0;
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + im::json_quote(v[i]);
  return s + "]";
}

std::string inspect_json(const std::vector<im::ImageEntry>& all, const im::ImageEntry& e) {
  std::vector<std::string> tags;
  for (const auto& o : all)
    if (o.error.empty() && o.config_digest == e.config_digest && o.ref) tags.push_back(o.ref->familiar());
  std::string labels = "{";
  for (const auto& [k, v] : e.config.labels) labels += (labels.size() > 1 ? "," : "") + im::json_quote(k) + ":" + im::json_quote(v);
  labels += "}";
  std::vector<std::string> diff;
  for (const auto& d : e.config.diff_ids) diff.push_back(d.str());
  return fmt::format(
      R"({{"Id":"{}","RepoTags":{},"Manifest":"{}","Created":{},"Architecture":{},"Os":{},"Config":{{"User":{},"Env":{},"Entrypoint":{},"Cmd":{},"WorkingDir":{},"Labels":{}}},"RootFS":{{"Type":"layers","Layers":{}}},"Size":{}}})",
      e.config_digest.str(), json_strings(tags), e.manifest_desc.digest.str(), im::json_quote(e.config.created),
      im::json_quote(e.config.architecture), im::json_quote(e.config.os), im::json_quote(e.config.user),
      json_strings(e.config.env), e.config.has_entrypoint ? json_strings(e.config.entrypoint) : "null",
      e.config.has_cmd ? json_strings(e.config.cmd) : "null", im::json_quote(e.config.working_dir), labels,
      json_strings(diff), e.size);
}

int inspect(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("image inspect", p.error().message);
  if (p->positional.empty()) return usage_error("image inspect", "IMAGE is required");
  auto store = im::Store::open(state_of(*p));
  if (!store) return fail("image inspect", store.error().message);
  auto all = im::list_images(*store);
  if (!all) return fail("image inspect", all.error().message);
  int rc = 0;
  std::vector<std::string> out;
  for (const auto& text : p->positional) {
    auto hits = im::match_images(*all, text);
    if (hits.empty()) {
      rc = fail("image inspect", fmt::format("no such image: {}", text));
      continue;
    }
    out.push_back(inspect_json(*all, *hits[0]));
  }
  fmt::print("[");
  for (size_t i = 0; i < out.size(); ++i) fmt::print("{}{}", i ? ",\n" : "\n", out[i]);
  fmt::print("\n]\n");
  return rc;
}

int prune(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"all", false, "-a"}, {"force", false, "-f"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("image prune", p.error().message);
  fs::path state = state_of(*p);
  auto store = im::Store::open(state);
  if (!store) return fail("image prune", store.error().message);
  auto all = im::list_images(*store);
  if (!all) return fail("image prune", all.error().message);
  auto used = im::configs_in_use(state);
  std::set<im::Digest> in_use(used.begin(), used.end());
  fmt::print("Deleted Images:\n");
  for (const auto& e : *all) {
    bool dangling = !e.ref;
    if (!(dangling || p->has("all"))) continue;
    if (e.error.empty() && in_use.count(e.config_digest)) continue;
    if (store->remove_ref(e.ref_name)) fmt::print("{}: {}\n", e.ref ? "untagged" : "deleted", e.ref ? e.ref->familiar() : e.ref_name);
  }
  std::uint64_t freed = 0;
  collect(*store, state, "image prune", &freed);
  fmt::print("\nTotal reclaimed space: {}\n", human_size(freed));
  return 0;
}

int image_main(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    fmt::print("{}", kImageHelp);
    return args.empty() ? kExitUsage : 0;
  }
  Args rest(args.begin() + 1, args.end());
  std::string_view sub = args[0];
  if (sub == "inspect") return inspect(rest);
  if (sub == "prune") return prune(rest);
  if (sub == "ls" || sub == "list") return images_main(rest);
  if (sub == "rm") return rmi_main(rest);
  if (sub == "load") return load_main(rest);
  if (sub == "tag") return tag_main(rest);
  return usage_error("image", fmt::format("unknown subcommand '{}'", sub));
}

const Registrar load_reg{{"load", "load images from a docker save or OCI archive", load_main}};
const Registrar images_reg{{"images", "list the images in the store", images_main}};
const Registrar rmi_reg{{"rmi", "remove images from the store", rmi_main}};
const Registrar tag_reg{{"tag", "name an image anew", tag_main}};
const Registrar image_reg{{"image", "manage images: inspect, prune, ls, rm, load, tag", image_main}};

}  // namespace
}  // namespace nes::cli
