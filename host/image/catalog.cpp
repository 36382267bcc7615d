#include "host/image/catalog.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include <simdjson.h>

#include <fmt/format.h>

#include "host/image/unpack.hpp"

namespace nes::image {

namespace fs = std::filesystem;

Result<std::vector<ImageEntry>> list_images(const Store& store, std::string_view platform) {
  auto refs = store.refs();
  if (!refs) return refs.error();
  std::vector<ImageEntry> out;
  for (const auto& r : *refs) {
    ImageEntry e;
    e.ref_name = r.name;
    if (!Digest::parse(r.name)) {
      if (auto pr = parse_reference(r.name); pr) e.ref = *pr;
    }
    auto m = resolve_manifest(store, r.name, platform, &e.manifest_desc);
    if (r.name.empty()) e.error = "a descriptor without a name in index.json";
    else if (!m) e.error = m.error().message;
    if (e.error.empty()) {
      e.manifest = std::move(*m);
      e.config_digest = e.manifest.config.digest;
      auto text = store.read_blob(e.config_digest, 4 << 20);
      if (!text) {
        e.error = text.error().message;
      } else if (auto c = parse_config(*text, fmt::format("image {}: config {}", r.name, e.config_digest.str())); !c) {
        e.error = c.error().message;
      } else {
        e.config = std::move(*c);
        e.size = e.manifest.config.size;
        for (const auto& l : e.manifest.layers) e.size += l.size;
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<const ImageEntry*> match_images(const std::vector<ImageEntry>& all, std::string_view text, bool* by_id) {
  std::vector<const ImageEntry*> out;
  if (by_id) *by_id = false;
  if (auto r = parse_reference(text); r) {
    for (const auto& e : all)
      if (e.ref_name == r->str()) out.push_back(&e);
    if (!out.empty()) return out;
  }
  std::string_view hex = text;
  if (hex.substr(0, 7) == "sha256:") hex = hex.substr(7);
  bool is_hex = hex.size() >= 4 && hex.size() <= 64 && hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
  if (!is_hex) return out;
  for (const auto& e : all)
    if (e.error.empty() && e.config_digest.hex.compare(0, hex.size(), hex) == 0) out.push_back(&e);
  if (!out.empty()) {
    if (by_id) *by_id = true;
    return out;
  }
  for (const auto& e : all)
    if (e.error.empty() && e.manifest_desc.digest.hex == hex) out.push_back(&e);
  if (by_id && !out.empty()) *by_id = true;
  return out;
}

namespace {
std::optional<Digest> vm_config(const fs::path& file) {
  host::Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  char buf[4096];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return std::nullopt;
  simdjson::dom::parser p;
  std::string_view c;
  if (p.parse(simdjson::padded_string(std::string_view(buf, static_cast<size_t>(n))))["config"].get(c)) return std::nullopt;
  auto d = Digest::parse(c);
  return d ? std::optional<Digest>(*d) : std::nullopt;
}
}  // namespace

std::vector<std::string> vms_using(const fs::path& state, const Digest& config) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(state, ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (auto d = vm_config(e.path() / kVmImageFile); d && *d == config) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Digest> configs_in_use(const fs::path& state) {
  std::set<Digest> s;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(state, ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (auto d = vm_config(e.path() / kVmImageFile)) s.insert(*d);
  }
  return {s.begin(), s.end()};
}

}  // namespace nes::image
