#include "host/image/reference.hpp"

#include <cctype>

#include <fmt/format.h>

namespace nes::image {

namespace {

bool is_alnum_lower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool is_word(char c) { return is_alnum_lower(c) || (c >= 'A' && c <= 'Z') || c == '_'; }

/// path-component := [a-z0-9]+ (separator [a-z0-9]+)*, separator := [_.] | __ | [-]+
bool valid_component(std::string_view s) {
  if (s.empty() || !is_alnum_lower(s.front()) || !is_alnum_lower(s.back())) return false;
  for (size_t i = 0; i < s.size();) {
    if (is_alnum_lower(s[i])) { ++i; continue; }
    size_t j = i;
    while (j < s.size() && !is_alnum_lower(s[j])) ++j;
    std::string_view sep = s.substr(i, j - i);
    bool dashes = sep.find_first_not_of('-') == std::string_view::npos;
    if (!(sep == "." || sep == "_" || sep == "__" || dashes)) return false;
    i = j;
  }
  return true;
}

/// domain := host [':' port]; host := label ('.' label)* | '[' ipv6 ']'.
bool valid_domain(std::string_view d) {
  std::string_view host = d, port;
  if (!d.empty() && d.front() == '[') {
    auto close = d.find(']');
    if (close == std::string_view::npos) return false;
    for (char c : d.substr(1, close - 1))
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':')) return false;
    host = {};
    std::string_view rest = d.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else if (auto colon = d.find(':'); colon != std::string_view::npos) {
    host = d.substr(0, colon);
    port = d.substr(colon + 1);
    if (port.empty()) return false;
  }
  for (char c : port)
    if (c < '0' || c > '9') return false;
  if (d.front() == '[') return true;
  if (host.empty()) return false;
  size_t start = 0;
  for (;;) {
    size_t dot = host.find('.', start);
    std::string_view label = host.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.front() == '-' || label.back() == '-') return false;
    for (char c : label)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) return false;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return true;
}

Error bad(std::string_view text, std::string_view why) {
  return Error{fmt::format("invalid reference format: {}: '{}'", why, text.substr(0, 300))};
}

}  // namespace

Result<Reference> parse_reference(std::string_view text) {
  if (text.empty()) return bad(text, "empty reference");
  if (text.size() > 1024) return bad(text, "longer than 1024 bytes");
  Reference r;
  std::string_view rest = text;
  if (auto at = rest.find('@'); at != std::string_view::npos) {
    auto d = Digest::parse(rest.substr(at + 1));
    if (!d) return bad(text, d.error().message);
    r.digest = *d;
    rest = rest.substr(0, at);
  }
  std::string_view name = rest;
  auto slash = rest.rfind('/');
  auto colon = rest.rfind(':');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
    std::string_view tag = rest.substr(colon + 1);
    if (tag.empty() || tag.size() > 128 || !is_word(tag.front())) return bad(text, fmt::format("tag '{}'", tag));
    for (char c : tag)
      if (!(is_word(c) || c == '.' || c == '-')) return bad(text, fmt::format("tag '{}'", tag));
    r.tag = tag;
    name = rest.substr(0, colon);
  }
  if (name.empty()) return bad(text, "empty repository name");
  if (name.size() == 64 && name.find_first_not_of("0123456789abcdef") == std::string_view::npos)
    return bad(text, "a 64-digit hex string is an image ID, not a repository name");
  // docker's splitDockerDomain
  std::string_view remainder = name;
  auto first = name.find('/');
  if (first == std::string_view::npos) {
    r.registry = "docker.io";
  } else {
    std::string_view head = name.substr(0, first);
    bool lower = true;
    for (char c : head)
      if (c >= 'A' && c <= 'Z') lower = false;
    if (head.find_first_of(".:") == std::string_view::npos && head != "localhost" && lower) {
      r.registry = "docker.io";
    } else {
      if (!valid_domain(head)) return bad(text, fmt::format("registry '{}'", head));
      r.registry = head;
      remainder = name.substr(first + 1);
    }
  }
  if (r.registry == "index.docker.io") r.registry = "docker.io";
  for (char c : remainder)
    if (c >= 'A' && c <= 'Z') return bad(text, "repository name must be lowercase");
  size_t start = 0;
  for (;;) {
    size_t s = remainder.find('/', start);
    std::string_view comp = remainder.substr(start, s == std::string_view::npos ? std::string_view::npos : s - start);
    if (!valid_component(comp)) return bad(text, fmt::format("repository path component '{}'", comp));
    if (s == std::string_view::npos) break;
    start = s + 1;
  }
  r.repository = remainder;
  if (r.registry == "docker.io" && remainder.find('/') == std::string_view::npos) r.repository = "library/" + r.repository;
  if (r.registry.size() + 1 + r.repository.size() > 255) return bad(text, "repository name longer than 255 bytes");
  if (r.tag.empty() && !r.digest) r.tag = "latest";
  return r;
}

std::string Reference::api_host() const { return registry == "docker.io" ? "registry-1.docker.io" : registry; }

std::string Reference::str() const {
  std::string s = registry;
  s.append("/").append(repository);
  if (!tag.empty()) s.append(":").append(tag);
  if (digest) s.append("@").append(digest->str());
  return s;
}

std::string Reference::familiar_name() const {
  if (registry != "docker.io") return std::string(registry).append("/").append(repository);
  std::string_view r = repository;
  if (r.substr(0, 8) == "library/" && r.find('/', 8) == std::string_view::npos) r = r.substr(8);
  return std::string(r);
}

std::string Reference::familiar() const {
  std::string s = familiar_name();
  if (!tag.empty()) s.append(":").append(tag);
  if (digest) s.append("@").append(digest->str());
  return s;
}

}  // namespace nes::image
