// docker config.json credentials (credentials.hpp).
#include "host/image/credentials.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <simdjson.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include "base/fd.hpp"

namespace nes::image {
namespace {

namespace fs = std::filesystem;
constexpr std::size_t kMaxConfig = 1u << 20;

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string b64encode(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
  return out;
}

std::optional<std::string> b64decode(std::string_view s) {
  if (s.size() % 4 != 0 || s.size() > 64 * 1024) return std::nullopt;
  std::string out(s.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return std::nullopt;
  std::size_t pad = 0;
  for (std::size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<std::size_t>(n) - std::min<std::size_t>(pad, static_cast<std::size_t>(n)));
  return out;
}

/// The file's top level: auths (key -> minified entry) and every other key (minified value).
struct Config {
  std::map<std::string, std::string> auths;
  std::map<std::string, std::string> other;
};

Result<Config> read_config(const fs::path& file) {
  Config c;
  base::Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return c;
    return host::errno_error(errno, file.string());
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno, file.string());
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfig) return Error{fmt::format("{}: larger than {} bytes", file.string(), kMaxConfig)};
  }
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return c;
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::object top;
  if (parser.parse(padded).get(top)) return Error{fmt::format("{}: not a JSON object", file.string())};
  for (auto field : top) {
    if (field.key == "auths") {
      simdjson::dom::object auths;
      if (field.value.get(auths)) return Error{fmt::format("{}: auths: not an object", file.string())};
      for (auto a : auths) c.auths[std::string(a.key)] = simdjson::minify(a.value);
    } else {
      c.other[std::string(field.key)] = simdjson::minify(field.value);
    }
  }
  return c;
}

Status write_config(const fs::path& file, const Config& c) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) return Error{fmt::format("{}: {}", file.parent_path().string(), ec.message())};
  ::chmod(file.parent_path().c_str(), 0700);
  std::string out = "{\n  \"auths\": {";
  bool first = true;
  for (const auto& [k, v] : c.auths) {
    out += fmt::format("{}\n    {}: {}", first ? "" : ",", json_string(k), v);
    first = false;
  }
  out += first ? "}" : "\n  }";
  for (const auto& [k, v] : c.other) out += fmt::format(",\n  {}: {}", json_string(k), v);
  out += "\n}\n";
  fs::path tmp = file;
  tmp += fmt::format(".tmp{}", ::getpid());
  base::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return host::errno_error(errno, tmp.string());
  ::fchmod(fd.get(), 0600);  // whatever the umask
  std::string_view rest = out;
  while (!rest.empty()) {
    ssize_t n = ::write(fd.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::unlink(tmp.c_str());
      return host::errno_error(e, tmp.string());
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  if (::fsync(fd.get()) != 0 || ::rename(tmp.c_str(), file.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return host::errno_error(e, file.string());
  }
  return host::Ok{};
}

}  // namespace

fs::path credentials_file(const fs::path& state_dir) { return state_dir / ".auth" / "config.json"; }

std::string credential_key(std::string_view registry) {
  if (registry == "docker.io" || registry == "index.docker.io" || registry == "registry-1.docker.io")
    return "https://index.docker.io/v1/";
  return std::string(registry);
}

Result<std::optional<Credential>> load_credential(const fs::path& state_dir, std::string_view registry) {
  fs::path file = credentials_file(state_dir);
  auto c = read_config(file);
  if (!c) return std::move(c).error();
  auto it = c->auths.find(credential_key(registry));
  if (it == c->auths.end()) return std::optional<Credential>{};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(it->second);
  simdjson::dom::element e;
  std::string_view auth;
  if (parser.parse(padded).get(e) || e["auth"].get(auth))
    return Error{fmt::format("{}: auths.{}: no \"auth\" string", file.string(), it->first)};
  auto plain = b64decode(auth);
  auto colon = plain ? plain->find(':') : std::string::npos;
  if (!plain || colon == std::string::npos)
    return Error{fmt::format("{}: auths.{}.auth: not base64 of USER:PASSWORD", file.string(), it->first)};
  return std::optional<Credential>{Credential{plain->substr(0, colon), plain->substr(colon + 1)}};
}

Status store_credential(const fs::path& state_dir, std::string_view registry, const Credential& cred) {
  fs::path file = credentials_file(state_dir);
  auto c = read_config(file);
  if (!c) return std::move(c).error();
  c->auths[credential_key(registry)] =
      fmt::format("{{\"auth\":{}}}", json_string(b64encode(cred.username + ":" + cred.password)));
  return write_config(file, *c);
}

Result<bool> remove_credential(const fs::path& state_dir, std::string_view registry) {
  fs::path file = credentials_file(state_dir);
  auto c = read_config(file);
  if (!c) return std::move(c).error();
  if (c->auths.erase(credential_key(registry)) == 0) return false;
  auto st = write_config(file, *c);
  if (!st) return std::move(st).error();
  return true;
}

}  // namespace nes::image
