// host/image/registry.hpp's pure parts and host/image/credentials.hpp: the WWW-Authenticate
// challenge parser (what registries send, and malformed headers), the CA lookup order (--cert-dir
// replaces certs.d; HOST:PORT directories; *.crt CAs, a *.cert/*.key client pair) and docker's
// config.json format (base64 USER:PASS under "auths", mode 0600, other keys kept, logout).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "host/image/credentials.hpp"
#include "host/image/registry.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes::image;
namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void put(const fs::path& p, std::string_view s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}
}  // namespace

TEST_CASE("a bearer challenge as the distribution registry sends it") {
  auto c = parse_challenge(
      R"(Bearer realm="https://127.0.0.1:5001/token",service="nes-test-registry",scope="repository:app:pull")");
  REQUIRE(c);
  CHECK(c->scheme == "Bearer");
  CHECK(c->params.at("realm") == "https://127.0.0.1:5001/token");
  CHECK(c->params.at("service") == "nes-test-registry");
  CHECK(c->params.at("scope") == "repository:app:pull");
}

TEST_CASE("challenge: spaces, unquoted values, escapes, case of keys, commas in quotes") {
  auto c = parse_challenge(R"(Basic Realm="a, \"b\"" , charset=UTF-8)");
  REQUIRE(c);
  CHECK(c->scheme == "Basic");
  CHECK(c->params.at("realm") == "a, \"b\"");
  CHECK(c->params.at("charset") == "UTF-8");
  auto bare = parse_challenge("Basic");
  REQUIRE(bare);
  CHECK(bare->params.empty());
}

TEST_CASE("challenge: malformed headers are refused, not guessed") {
  CHECK_FALSE(parse_challenge(""));
  CHECK_FALSE(parse_challenge("Bearer realm=\"unterminated"));
  CHECK_FALSE(parse_challenge("Bearer justaword"));
  std::string many = "Bearer ";
  for (int i = 0; i < 40; ++i) {
    many += "k";
    many += std::to_string(i);
    many += "=v,";
  }
  CHECK_FALSE(parse_challenge(many));
}

TEST_CASE("CA lookup: certs.d HOST:PORT, first root wins; --cert-dir replaces them") {
  nes::test::TempDir tmp("nes-reg");
  fs::path a = tmp.path / "containers", b = tmp.path / "docker", own = tmp.path / "own";
  put(b / "127.0.0.1:5000" / "ca.crt", "B");
  put(b / "127.0.0.1:5000" / "client.cert", "C");
  put(b / "127.0.0.1:5000" / "client.key", "K");
  TlsConfig tls;
  tls.certs_d = {a, b};
  auto f = cert_files_for("127.0.0.1:5000", tls);
  REQUIRE(f.cas.size() == 1);
  CHECK(f.cas[0] == b / "127.0.0.1:5000" / "ca.crt");
  CHECK(f.client_cert == b / "127.0.0.1:5000" / "client.cert");
  CHECK(f.client_key == b / "127.0.0.1:5000" / "client.key");
  put(a / "127.0.0.1:5000" / "x.crt", "A");
  f = cert_files_for("127.0.0.1:5000", tls);
  REQUIRE(f.cas.size() == 1);
  CHECK(f.cas[0] == a / "127.0.0.1:5000" / "x.crt");
  CHECK(cert_files_for("127.0.0.1:5001", tls).cas.empty());  // another port, another registry
  put(own / "one.crt", "1");
  put(own / "two.crt", "2");
  put(own / "lonely.cert", "no key beside it");
  tls.cert_dir = own;
  f = cert_files_for("127.0.0.1:5000", tls);
  REQUIRE(f.cas.size() == 2);
  CHECK(f.cas[0] == own / "one.crt");
  CHECK(f.client_cert.empty());
}

TEST_CASE("credentials: docker's config.json auths format, mode 0600, other keys kept, logout") {
  nes::test::TempDir tmp("nes-cred");
  fs::path state = tmp.path / "state";
  CHECK_FALSE(*load_credential(state, "127.0.0.1:5000"));
  REQUIRE(store_credential(state, "127.0.0.1:5000", {"alice", "pa:ss\"w"}));
  fs::path file = credentials_file(state);
  CHECK(file == state / ".auth" / "config.json");
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat(file.parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  // base64("alice:pa:ss\"w") as docker writes it
  CHECK(slurp(file).find(R"("127.0.0.1:5000": {"auth":"YWxpY2U6cGE6c3Midw=="})") != std::string::npos);
  auto c = load_credential(state, "127.0.0.1:5000");
  REQUIRE(c);
  REQUIRE(*c);
  CHECK((*c)->username == "alice");
  CHECK((*c)->password == "pa:ss\"w");

  // A file docker wrote, with keys of its own: kept on every rewrite.
  put(file, R"({"auths":{"https://index.docker.io/v1/":{"auth":"Ym9iOmh1Yg=="}},"credsStore":"x","HttpHeaders":{"A":"b"}})");
  REQUIRE(store_credential(state, "127.0.0.1:5000", {"u", "p"}));
  std::string text = slurp(file);
  CHECK(text.find(R"("credsStore": "x")") != std::string::npos);
  CHECK(text.find(R"("HttpHeaders": {"A":"b"})") != std::string::npos);
  auto hub = load_credential(state, "docker.io");
  REQUIRE(hub);
  REQUIRE(*hub);
  CHECK((*hub)->username == "bob");
  CHECK((*hub)->password == "hub");

  CHECK(*remove_credential(state, "127.0.0.1:5000"));
  CHECK_FALSE(*remove_credential(state, "127.0.0.1:5000"));
  CHECK_FALSE(*load_credential(state, "127.0.0.1:5000"));
  CHECK(*load_credential(state, "docker.io"));
}

TEST_CASE("credentials: a broken file is an error naming it, never a crash") {
  nes::test::TempDir tmp("nes-cred");
  fs::path file = credentials_file(tmp.path);
  put(file, "not json");
  auto r = load_credential(tmp.path, "h");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find(file.string()) != std::string::npos);
  put(file, R"({"auths":{"h":{"auth":"!!!!"}}})");
  r = load_credential(tmp.path, "h");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("not base64") != std::string::npos);
  put(file, R"({"auths":{"h":{"auth":"bm9jb2xvbg=="}}})");  // "nocolon"
  CHECK_FALSE(load_credential(tmp.path, "h"));
  put(file, R"({"auths":[]})");
  CHECK_FALSE(load_credential(tmp.path, "h"));
}
