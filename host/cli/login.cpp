// `neshost login` and `logout`: registry credentials in docker's config.json format under STATE
// (host/image/credentials.hpp), checked against the registry before they are stored, as docker
// login does.
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/registry_flags.hpp"
#include "host/image/credentials.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLoginHelp = R"(usage: neshost login [--state DIR] [-u USER] [-p PASSWORD | --password-stdin] [--cert-dir DIR] [--tls-verify=false] [REGISTRY]

Check USER's password with REGISTRY (HOST[:PORT]; default docker.io) and store them in
STATE/.auth/config.json (docker's config.json "auths" format, mode 0600), for `neshost pull`.
  -u, --username USER   the user (asked for on a terminal when not given)
  -p, --password PASS   the password (visible to other users in ps: prefer --password-stdin)
  --password-stdin      read the password from stdin (its first line)
  --cert-dir DIR        the registry's CA in DIR/*.crt (default: /etc/containers/certs.d/REGISTRY/,
                        /etc/docker/certs.d/REGISTRY/, then the system's CAs)
  --tls-verify=false    do not verify the registry's certificate (and allow plain HTTP)
  --state DIR           state directory (default as `neshost run`)
Exit 125 when the registry refuses the credentials or cannot be reached.
)";

constexpr std::string_view kLogoutHelp = R"(usage: neshost logout [--state DIR] [REGISTRY]

Remove REGISTRY's credentials (default docker.io) from STATE/.auth/config.json.
Exit 1 when there were none.
)";

/// One line from fd 0 without its newline (at most 4 KiB); echo off when `secret` on a terminal.
std::optional<std::string> read_line(bool secret) {
  termios old{};
  bool tty = ::isatty(0) && ::tcgetattr(0, &old) == 0;
  if (tty && secret) {
    termios t = old;
    t.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    ::tcsetattr(0, TCSAFLUSH, &t);
  }
  std::string line;
  char c;
  bool any = false;
  while (line.size() < 4096) {
    ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    any = true;
    if (c == '\n') break;
    line += c;
  }
  if (tty && secret) {
    ::tcsetattr(0, TCSAFLUSH, &old);
    fmt::print(stderr, "\n");
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (!any) return std::nullopt;
  return line;
}

int login_main(const Args& args) {
  static constexpr FlagSpec specs[] = {{"state", true}, {"username", true, "-u"}, {"password", true, "-p"},
                                       {"password-stdin", false}, kCertDirFlag, kTlsVerifyFlag};
  auto p = parse_flags(specs, args);
  if (!p) return usage_error("login", p.error().message);
  if (p->help) {
    fmt::print("{}", kLoginHelp);
    return 0;
  }
  if (p->positional.size() > 1) return usage_error("login", "at most one REGISTRY");
  auto tls = registry_tls(*p);
  if (!tls) return usage_error("login", tls.error().message);
  if (p->has("password") && p->has("password-stdin"))
    return usage_error("login", "--password and --password-stdin exclude each other");
  auto [name, api_host] = registry_names(p->positional.empty() ? "docker.io" : p->positional[0]);
  if (name.empty()) return usage_error("login", "REGISTRY is empty");
  fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();

  image::Credential cred;
  const bool tty = ::isatty(0);
  if (auto u = p->get("username")) {
    cred.username = *u;
  } else if (tty && !p->has("password-stdin")) {
    fmt::print(stderr, "Username: ");
    auto l = read_line(false);
    if (!l) return usage_error("login", "no username");
    cred.username = *l;
  } else {
    return usage_error("login", "-u USER is required when stdin is not a terminal");
  }
  if (cred.username.empty() || cred.username.find(':') != std::string::npos)
    return usage_error("login", "the username is empty or holds a ':'");
  if (auto pw = p->get("password")) {
    cred.password = *pw;
  } else if (p->has("password-stdin")) {
    auto l = read_line(false);
    if (!l) return usage_error("login", "--password-stdin: nothing on stdin");
    cred.password = *l;
  } else if (tty) {
    fmt::print(stderr, "Password: ");
    auto l = read_line(true);
    if (!l) return usage_error("login", "no password");
    cred.password = *l;
  } else {
    return usage_error("login", "no password: give --password-stdin (or -p)");
  }
  if (cred.password.empty()) return usage_error("login", "the password is empty");

  image::Registry reg(api_host, *tls, cred);
  if (auto st = reg.ping(); !st) {
    fmt::print(stderr, "neshost login: {}\n", st.error().message);
    return 125;
  }
  if (auto st = image::store_credential(state, name, cred); !st) {
    fmt::print(stderr, "neshost login: {}\n", st.error().message);
    return 125;
  }
  fmt::print("Login Succeeded\n");
  return 0;
}

int logout_main(const Args& args) {
  static constexpr FlagSpec specs[] = {{"state", true}};
  auto p = parse_flags(specs, args);
  if (!p) return usage_error("logout", p.error().message);
  if (p->help) {
    fmt::print("{}", kLogoutHelp);
    return 0;
  }
  if (p->positional.size() > 1) return usage_error("logout", "at most one REGISTRY");
  auto name = registry_names(p->positional.empty() ? "docker.io" : p->positional[0]).first;
  fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();
  auto r = image::remove_credential(state, name);
  if (!r) {
    fmt::print(stderr, "neshost logout: {}\n", r.error().message);
    return 125;
  }
  if (!*r) {
    fmt::print(stderr, "neshost logout: not logged in to {}\n", name);
    return 1;
  }
  fmt::print("Removing login credentials for {}\n", name);
  return 0;
}

}  // namespace

const Registrar login_reg{{"login", "store a registry's credentials (checked with it first)", login_main}};
const Registrar logout_reg{{"logout", "remove a registry's stored credentials", logout_main}};

}  // namespace nes::cli
