#include "route.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>

#include "queen_locks/errors.hpp"

namespace queen_locks::detail {

namespace {

// Answers a proxy or the route gives when the call may or may not have been
// applied: the same call sent again with the same owner converges.
bool answerless(long status) { return status == 502 || status == 503 || status == 504; }

// The most of an answer we read: far more than 64 results ever take.
constexpr std::size_t kMaxAnswer = 4u << 20;

void init_curl() {
  // curl_global_init is not safe to race with itself; once per process.
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("libcurl could not be initialised");
  });
}

size_t collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() + size * n > kMaxAnswer) return 0;  // ends the transfer with CURLE_WRITE_ERROR
  body->append(data, size * n);
  return size * n;
}

struct EasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct ListDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string what_of(const json& op) {
  return op.value("op", std::string("call")) + " \"" + op.value("name", std::string()) + "\"";
}

}  // namespace

std::vector<Holder> holders_of(const json& result) {
  std::vector<Holder> out;
  auto it = result.find("holders");
  if (it == result.end() || !it->is_array()) return out;
  for (const json& h : *it) {
    if (!h.is_object()) continue;
    out.push_back(Holder{h.value("slot", 0), h.value("owner", std::string()), h.value("token", std::uint64_t{0}),
                         h.value("since", std::string()), h.value("renewedAt", std::string()),
                         h.value("expiresAt", std::string())});
  }
  return out;
}

std::optional<Guard> guard_of(const json& result) {
  auto it = result.find("guard");
  if (it == result.end() || !it->is_object()) return std::nullopt;
  const json& g = *it;
  return Guard{g.value("op", std::string()), g.value("ns", std::string()), g.value("namespace", std::string()),
               g.value("key", std::string()), g.value("expect", std::uint64_t{0}), g.value("required", false)};
}

std::string route_url(const std::string& url) {
  if (url.empty())
    throw InvalidArgument("url", "no route URL: pass Options::url or set QUEEN_LOCKS_URL (for example http://localhost:6632)");
  auto scheme = url.find("://");
  std::string s = scheme == std::string::npos ? std::string() : url.substr(0, scheme);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if ((s != "http" && s != "https") || url.size() == scheme + 3 || url[scheme + 3] == '/')
    throw InvalidArgument("url", "route URL \"" + url + "\": must be http:// or https:// with a host");
  auto path = url.find('/', scheme + 3);
  if (path == std::string::npos) return url + kRoutePath;
  if (url.compare(path, std::string::npos, "/") == 0) return url.substr(0, path) + kRoutePath;
  return url;
}

Route::Route(const std::string& url, std::string ns, std::optional<std::string> token_file, std::string ca_file)
    : url_(route_url(url)),
      ns_(std::move(ns)),
      ca_file_(std::move(ca_file)),
      // A file the caller named must exist; the default one is used when
      // it does; an empty name means no token.
      token_(token_file ? *token_file : kDefaultTokenFile, token_file.has_value()) {
  if (!ca_file_.empty() && !std::ifstream(ca_file_))
    throw InvalidArgument("ca_file", "CA file " + ca_file_ + ": does not exist or cannot be read");
  init_curl();
}

json Route::call(const json& op, Millis timeout) const {
  json body = {{"operations", json::array({op})}};
  if (!ns_.empty()) body["namespace"] = ns_;
  const std::string data = body.dump();
  const std::string what = what_of(op);

  std::unique_ptr<CURL, EasyDeleter> easy(curl_easy_init());
  if (!easy) throw Error(what + ": libcurl could not make a handle");
  std::unique_ptr<curl_slist, ListDeleter> headers;
  auto add = [&headers](const std::string& h) {
    curl_slist* l = curl_slist_append(headers.get(), h.c_str());
    if (l == nullptr) throw Error("libcurl could not add a header");
    headers.release();
    headers.reset(l);
  };
  add("Content-Type: application/json");
  add("Accept: application/json");
  add("Expect:");  // no 100-continue round trip
  if (auto token = token_.read(); !token.empty()) add("Authorization: Bearer " + token);

  std::string answer;
  char errbuf[CURL_ERROR_SIZE] = {0};
  CURL* h = easy.get();
  curl_easy_setopt(h, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, data.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(data.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  // Threads: no signals for timeouts.
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  const long ms = std::max<long>(50, static_cast<long>(timeout.count()));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, std::min<long>(ms, 10000));
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: CURLOPT_PROTOCOLS is deprecated
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(h, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  if (!ca_file_.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, ca_file_.c_str());

  CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    std::string why = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    switch (rc) {
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_SSL_CERTPROBLEM:
        // Asking again will not help: the route is not the one we trust.
        throw Error(what + ": " + url_ + ": " + why + ": the route's certificate is not trusted (pass ca_file)");
      case CURLE_WRITE_ERROR:
        throw Error(what + ": " + url_ + ": the answer is larger than 4 MiB");
      default:
        throw Unavailable(what + ": no answer from " + url_ + ": " + why);
    }
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    std::string message = answer, field;
    std::optional<int> index;
    json err = json::parse(answer, nullptr, false);
    if (err.is_object() && err.contains("error") && err["error"].is_object()) {
      const json& e = err["error"];
      message = e.value("message", message);
      field = e.value("field", std::string());
      if (e.contains("index") && e["index"].is_number_integer()) index = e["index"].get<int>();
    }
    if (answerless(status)) throw Unavailable(what + ": the route answered " + std::to_string(status) + ": " + message, status);
    throw RouteError(status, message, field, index);
  }
  json parsed = json::parse(answer, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("results") || !parsed["results"].is_array())
    throw Error(what + ": the route answered something that is not JSON results: " + answer.substr(0, 200));
  const json& results = parsed["results"];
  if (results.size() != 1 || !results[0].is_object())
    throw Error(what + ": the route answered " + std::to_string(results.size()) + " results to one operation");
  return results[0];
}

std::pair<json, int> Route::acquire(const std::string& name, const std::string& owner, std::int64_t ttl_seconds,
                                    int limit, int wait_seconds) const {
  json op = {{"op", "acquire"}, {"name", name}, {"ttlSeconds", ttl_seconds}, {"owner", owner}, {"limit", limit}};
  if (wait_seconds > 0 && takes_wait()) {
    op["waitSeconds"] = wait_seconds;
    try {
      return {call(op, kCallTimeout + std::chrono::seconds(wait_seconds)), wait_seconds};
    } catch (const RouteError& e) {
      // A route from before waitSeconds refuses the field, the whole call
      // (nothing applied): remember it and poll instead.
      if (e.status() != 400 || e.field() != "waitSeconds") throw;
      takes_wait_.store(false);
      op.erase("waitSeconds");
    }
  }
  return {call(op, kCallTimeout), 0};
}

json Route::renew(const std::string& name, int slot, std::uint64_t token, const std::string& owner,
                  std::int64_t ttl_seconds, Millis timeout) const {
  return call({{"op", "renew"}, {"name", name}, {"slot", slot}, {"token", token}, {"owner", owner}, {"ttlSeconds", ttl_seconds}},
              timeout);
}

json Route::release(const std::string& name, int slot, std::uint64_t token, const std::string& owner,
                    Millis timeout) const {
  return call({{"op", "release"}, {"name", name}, {"slot", slot}, {"token", token}, {"owner", owner}}, timeout);
}

json Route::get(const std::string& name) const { return call({{"op", "get"}, {"name", name}}, kCallTimeout); }

json Route::check(const std::string& name, int slot, std::uint64_t expect) const {
  return call({{"op", "check"}, {"name", name}, {"slot", slot}, {"expect", expect}}, kCallTimeout);
}

}  // namespace queen_locks::detail
