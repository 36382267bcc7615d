#include "host/image/manifest.hpp"

#include <simdjson.h>

#include <fmt/format.h>

namespace nes::image {

namespace {

namespace sj = simdjson;
constexpr size_t kMaxDocument = 4 << 20;  // 4 MiB: the registry's own manifest limit

Error field_error(std::string_view what, std::string_view field, std::string_view why) {
  return Error{fmt::format("{}: field '{}': {}", what, field, why)};
}

Result<sj::dom::object> parse_object(sj::dom::parser& p, std::string_view json, std::string_view what) {
  if (json.size() > kMaxDocument) return Error{fmt::format("{}: larger than {} bytes", what, kMaxDocument)};
  sj::dom::element root;
  if (auto e = p.parse(sj::padded_string(json)).get(root))
    return Error{fmt::format("{}: not JSON: {}", what, sj::error_message(e))};
  sj::dom::object o;
  if (root.get(o)) return Error{fmt::format("{}: not a JSON object", what)};
  return o;
}

/// An optional string field: "" when absent; an error when present and not a string.
Result<std::string> opt_string(sj::dom::object o, std::string_view key, std::string_view what) {
  sj::dom::element e;
  if (o[key].get(e) == sj::NO_SUCH_FIELD) return std::string();
  if (e.is_null()) return std::string();
  std::string_view s;
  if (e.get(s)) return field_error(what, key, "not a string");
  return std::string(s);
}

Result<std::vector<std::string>> opt_strings(sj::dom::object o, std::string_view key, std::string_view what,
                                             bool* present) {
  std::vector<std::string> out;
  sj::dom::element e;
  if (present) *present = false;
  if (o[key].get(e) == sj::NO_SUCH_FIELD || e.is_null()) return out;
  sj::dom::array a;
  if (e.get(a)) return field_error(what, key, "not an array of strings");
  for (auto item : a) {
    std::string_view s;
    if (item.get(s)) return field_error(what, key, "not an array of strings");
    out.emplace_back(s);
  }
  if (present) *present = true;
  return out;
}

Result<std::map<std::string, std::string>> opt_string_map(sj::dom::object o, std::string_view key,
                                                          std::string_view what) {
  std::map<std::string, std::string> out;
  sj::dom::element e;
  if (o[key].get(e) == sj::NO_SUCH_FIELD || e.is_null()) return out;
  sj::dom::object m;
  if (e.get(m)) return field_error(what, key, "not an object");
  for (auto [k, v] : m) {
    std::string_view s;
    if (v.get(s)) return field_error(what, fmt::format("{}.{}", key, k), "not a string");
    out.emplace(std::string(k), std::string(s));
  }
  return out;
}

Result<Descriptor> parse_descriptor(sj::dom::element e, std::string_view what, std::string_view field) {
  sj::dom::object o;
  if (e.get(o)) return field_error(what, field, "not an object");
  Descriptor d;
  std::string_view s;
  if (o["mediaType"].get(s)) return field_error(what, std::string(field) + ".mediaType", "missing or not a string");
  d.media_type = s;
  if (o["digest"].get(s)) return field_error(what, std::string(field) + ".digest", "missing or not a string");
  auto dg = Digest::parse(s);
  if (!dg) return field_error(what, std::string(field) + ".digest", dg.error().message);
  d.digest = *dg;
  int64_t size = 0;
  if (o["size"].get(size) || size < 0)
    return field_error(what, std::string(field) + ".size", "missing or not a non-negative integer");
  d.size = static_cast<uint64_t>(size);
  auto ann = opt_string_map(o, "annotations", what);
  if (!ann) return ann.error();
  d.annotations = std::move(*ann);
  sj::dom::object pl;
  if (sj::dom::element pe; o["platform"].get(pe) != sj::NO_SUCH_FIELD) {
    if (pe.get(pl)) return field_error(what, std::string(field) + ".platform", "not an object");
    Platform p;
    auto os = opt_string(pl, "os", what), arch = opt_string(pl, "architecture", what),
         var = opt_string(pl, "variant", what);
    if (!os || !arch || !var) return field_error(what, std::string(field) + ".platform", "bad os/architecture/variant");
    p.os = *os;
    p.architecture = *arch;
    p.variant = *var;
    d.platform = p;
  }
  return d;
}

}  // namespace

std::string Platform::str() const {
  std::string s = os + "/" + architecture;
  if (!variant.empty()) s += "/" + variant;
  return s;
}

Result<Platform> parse_platform(std::string_view text) {
  Platform p;
  auto a = text.find('/');
  if (a == std::string_view::npos || a == 0)
    return Error{fmt::format("platform '{}': expected OS/ARCH[/VARIANT]", text)};
  p.os = text.substr(0, a);
  std::string_view rest = text.substr(a + 1);
  auto b = rest.find('/');
  p.architecture = rest.substr(0, b);
  if (b != std::string_view::npos) p.variant = rest.substr(b + 1);
  if (p.architecture.empty() || (b != std::string_view::npos && p.variant.empty()) ||
      p.variant.find('/') != std::string::npos)
    return Error{fmt::format("platform '{}': expected OS/ARCH[/VARIANT]", text)};
  return p;
}

Result<DocKind> sniff_document(std::string_view json, std::string_view what) {
  sj::dom::parser p;
  auto o = parse_object(p, json, what);
  if (!o) return o.error();
  auto mt = opt_string(*o, "mediaType", what);
  if (!mt) return mt.error();
  if (*mt == media::kOciIndex || *mt == media::kDockerList) return DocKind::index;
  if (*mt == media::kOciManifest || *mt == media::kDockerManifest) return DocKind::manifest;
  if (!mt->empty()) return field_error(what, "mediaType", fmt::format("'{}' is neither an image index nor a manifest", *mt));
  sj::dom::element e;
  if (o->at_key("manifests").get(e) == sj::SUCCESS) return DocKind::index;
  if (o->at_key("config").get(e) == sj::SUCCESS && o->at_key("layers").get(e) == sj::SUCCESS) return DocKind::manifest;
  if (o->at_key("schemaVersion").get(e) == sj::SUCCESS && o->at_key("fsLayers").get(e) == sj::SUCCESS)
    return Error{fmt::format("{}: a Docker schema 1 manifest (deprecated, not supported)", what)};
  return Error{fmt::format("{}: neither an image index nor a manifest (no mediaType, manifests or config/layers)", what)};
}

Result<Index> parse_index(std::string_view json, std::string_view what) {
  sj::dom::parser p;
  auto o = parse_object(p, json, what);
  if (!o) return o.error();
  Index ix;
  auto mt = opt_string(*o, "mediaType", what);
  if (!mt) return mt.error();
  if (!mt->empty() && *mt != media::kOciIndex && *mt != media::kDockerList)
    return field_error(what, "mediaType", fmt::format("'{}' is not an image index", *mt));
  ix.media_type = *mt;
  sj::dom::array a;
  if (o->at_key("manifests").get(a)) return field_error(what, "manifests", "missing or not an array");
  size_t i = 0;
  for (auto m : a) {
    if (i >= 4096) return field_error(what, "manifests", "more than 4096 entries");
    auto d = parse_descriptor(m, what, fmt::format("manifests[{}]", i++));
    if (!d) return d.error();
    ix.manifests.push_back(std::move(*d));
  }
  return ix;
}

Result<Manifest> parse_manifest(std::string_view json, std::string_view what) {
  sj::dom::parser p;
  auto o = parse_object(p, json, what);
  if (!o) return o.error();
  Manifest m;
  auto mt = opt_string(*o, "mediaType", what);
  if (!mt) return mt.error();
  if (!mt->empty() && *mt != media::kOciManifest && *mt != media::kDockerManifest)
    return field_error(what, "mediaType", fmt::format("'{}' is not an image manifest", *mt));
  m.media_type = mt->empty() ? std::string(media::kOciManifest) : *mt;
  sj::dom::element ce;
  if (o->at_key("config").get(ce)) return field_error(what, "config", "missing");
  auto c = parse_descriptor(ce, what, "config");
  if (!c) return c.error();
  m.config = std::move(*c);
  sj::dom::array a;
  if (o->at_key("layers").get(a)) return field_error(what, "layers", "missing or not an array");
  size_t i = 0;
  for (auto l : a) {
    if (i >= 1024) return field_error(what, "layers", "more than 1024 layers");
    auto d = parse_descriptor(l, what, fmt::format("layers[{}]", i++));
    if (!d) return d.error();
    m.layers.push_back(std::move(*d));
  }
  return m;
}

Result<ImageConfig> parse_config(std::string_view json, std::string_view what) {
  sj::dom::parser p;
  auto o = parse_object(p, json, what);
  if (!o) return o.error();
  ImageConfig c;
  for (auto [key, dst] : {std::pair{"architecture", &c.architecture}, {"os", &c.os}, {"variant", &c.variant},
                          {"created", &c.created}}) {
    auto s = opt_string(*o, key, what);
    if (!s) return s.error();
    *dst = *s;
  }
  sj::dom::element ce;
  if (o->at_key("config").get(ce) == sj::SUCCESS && !ce.is_null()) {
    sj::dom::object cfg;
    if (ce.get(cfg)) return field_error(what, "config", "not an object");
    std::string where = fmt::format("{}: config", what);
    auto user = opt_string(cfg, "User", where), wd = opt_string(cfg, "WorkingDir", where);
    if (!user) return user.error();
    if (!wd) return wd.error();
    c.user = *user;
    c.working_dir = *wd;
    auto env = opt_strings(cfg, "Env", where, nullptr);
    if (!env) return env.error();
    c.env = std::move(*env);
    auto ep = opt_strings(cfg, "Entrypoint", where, &c.has_entrypoint);
    if (!ep) return ep.error();
    c.entrypoint = std::move(*ep);
    auto cmd = opt_strings(cfg, "Cmd", where, &c.has_cmd);
    if (!cmd) return cmd.error();
    c.cmd = std::move(*cmd);
    auto labels = opt_string_map(cfg, "Labels", where);
    if (!labels) return labels.error();
    c.labels = std::move(*labels);
  }
  sj::dom::object rootfs;
  if (o->at_key("rootfs").get(rootfs)) return field_error(what, "rootfs", "missing or not an object");
  sj::dom::array ids;
  if (rootfs["diff_ids"].get(ids)) return field_error(what, "rootfs.diff_ids", "missing or not an array");
  for (auto id : ids) {
    std::string_view s;
    if (id.get(s)) return field_error(what, "rootfs.diff_ids", "not an array of strings");
    auto d = Digest::parse(s);
    if (!d) return field_error(what, "rootfs.diff_ids", d.error().message);
    c.diff_ids.push_back(*d);
  }
  return c;
}

Result<Descriptor> select_platform(const Index& index, std::string_view platform, std::string_view what) {
  auto want = parse_platform(platform);
  if (!want) return want.error();
  std::string have;
  for (const auto& d : index.manifests) {
    if (!d.platform) continue;
    if (d.platform->os == want->os && d.platform->architecture == want->architecture &&
        (want->variant.empty() || d.platform->variant == want->variant))
      return d;
    if (!have.empty()) have += ", ";
    have += d.platform->str();
  }
  return Error{fmt::format("no manifest for {} in {} (it has {})", platform, what, have.empty() ? "none with a platform" : have)};
}

bool is_layer_media_type(std::string_view t) {
  return t == media::kOciLayer || t == media::kOciLayerGzip || t == media::kOciLayerZstd ||
         t == media::kDockerLayer || t == media::kDockerLayerGzip ||
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar" ||
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip" ||
         t == "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" ||
         t == "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string descriptor_json(const Descriptor& d) {
  std::string s = fmt::format(R"({{"mediaType":{},"digest":"{}","size":{})", json_quote(d.media_type), d.digest.str(), d.size);
  if (!d.annotations.empty()) {
    s += ",\"annotations\":{";
    bool first = true;
    for (const auto& [k, v] : d.annotations) {
      if (!first) s += ",";
      first = false;
      s += json_quote(k) + ":" + json_quote(v);
    }
    s += "}";
  }
  if (d.platform) {
    s += fmt::format(R"(,"platform":{{"architecture":{},"os":{})", json_quote(d.platform->architecture), json_quote(d.platform->os));
    if (!d.platform->variant.empty()) s += ",\"variant\":" + json_quote(d.platform->variant);
    s += "}";
  }
  return s + "}";
}

}  // namespace nes::image
