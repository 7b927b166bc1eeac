#include "services/coordinator/console/console_server.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "services/coordinator/console/console_assets.h"

namespace shoal::coordinator::console {
namespace {

constexpr char kCookie[] = "shoal_console";
constexpr int kThreads = 32;
constexpr size_t kMaxEventStreams = 24;  // each holds one of kThreads
constexpr size_t kMaxBody = 2 << 20;     // a task file is at most 1 MiB

// A JSON string literal of `text`, escaped by protobuf's JSON printer.
std::string JsonString(const std::string& text) {
  google::protobuf::Value value;
  value.set_string_value(text);
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(value, &json);
  return json;
}

void SendJson(httplib::Response& res, int status, const std::string& json) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(json, "application/json");
}

void SendError(httplib::Response& res, const absl::Status& status) {
  SendJson(res, HttpStatusFor(status.code()),
           absl::StrCat("{\"error\":", JsonString(std::string(status.message())),
                        ",\"code\":", JsonString(absl::StatusCodeToString(status.code())), "}"));
}

// The value of cookie `name` in the request's Cookie headers, or "".
std::string CookieValue(const httplib::Request& req, absl::string_view name) {
  const size_t n = req.get_header_value_count("Cookie");
  for (size_t i = 0; i < n; ++i) {
    for (absl::string_view pair : absl::StrSplit(req.get_header_value("Cookie", i), ';')) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(absl::StripAsciiWhitespace(pair), absl::MaxSplits('=', 1));
      if (kv.first == name) return std::string(kv.second);
    }
  }
  return "";
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

absl::Status ConsoleOptions::Validate() const {
  if (keep_alive < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError("console keep-alive: must be at least 10ms");
  }
  if (listen.empty()) {
    if (tokens_file.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("--console-tokens: given without --console-listen");
  }
  SHOAL_RETURN_IF_ERROR(ParseHostPort(listen, "--console-listen").status());
  if (tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "--console-tokens: required with --console-listen (a file of `admin TOKEN` / "
        "`viewer TOKEN` lines; docs/how-to/web-console.md)");
  }
  return absl::OkStatus();
}

ConsoleServer::ConsoleServer(TokenTable tokens, v1::ControlService::StubInterface& stub,
                             ConsoleApi::OwnerStubs owners, absl::Duration keep_alive)
    : tokens_(std::move(tokens)),
      api_(stub, absl::Seconds(30), std::move(owners)),
      keep_alive_(keep_alive) {}

absl::StatusOr<std::unique_ptr<ConsoleServer>> ConsoleServer::Start(
    const ConsoleOptions& options, v1::ControlService::StubInterface& stub,
    ConsoleApi::OwnerStubs owners) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_ASSIGN_OR_RETURN(HostPort listen, ParseHostPort(options.listen, "--console-listen"));
  SHOAL_ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load(options.tokens_file));
  std::unique_ptr<ConsoleServer> s(
      new ConsoleServer(std::move(tokens), stub, std::move(owners), options.keep_alive));
  if (!options.tls_dir.empty()) {
    const std::string cert = (std::filesystem::path(options.tls_dir) / "tls.crt").string();
    const std::string key = (std::filesystem::path(options.tls_dir) / "tls.key").string();
    auto https = std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--console-listen: cannot serve TLS with ", cert, " and ", key));
    }
    s->http_ = std::move(https);
    s->tls_ = true;
  } else {
    s->http_ = std::make_unique<httplib::Server>();
  }
  s->http_->new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  s->http_->set_payload_max_length(kMaxBody);
  s->http_->set_keep_alive_timeout(2);  // an idle connection holds a thread; Shutdown waits
  s->Route();
  SHOAL_ASSIGN_OR_RETURN(s->listener_,
                         http::Listener::Start(*s->http_, listen, "--console-listen"));

  LogInfo("web console on ", s->url(), " (", s->tokens_.size(), " tokens from ",
          options.tokens_file, ")");
  return s;
}

ConsoleServer::~ConsoleServer() { Shutdown(); }

size_t ConsoleServer::event_streams() const {
  absl::MutexLock lock(&mu_);
  return watches_.size();
}

std::string ConsoleServer::url() const {
  return absl::StrCat(tls_ ? "https://" : "http://", address(), "/");
}

void ConsoleServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (TaskWatch* watch : watches_) watch->Cancel();
  }
  listener_.Stop();
}

void ConsoleServer::Reply(const absl::StatusOr<std::string>& result, httplib::Response& res,
                          int ok) {
  if (!result.ok()) return SendError(res, result.status());
  SendJson(res, ok, *result);
}

std::optional<Role> ConsoleServer::Authorize(const httplib::Request& req, httplib::Response& res,
                                             bool admin) {
  std::optional<Role> role;
  if (req.has_header("Authorization")) {
    const std::string header = req.get_header_value("Authorization");
    if (absl::StartsWith(header, "Bearer ")) role = tokens_.Find(header.substr(7));
  } else {
    role = sessions_.Find(CookieValue(req, kCookie));
  }
  if (!role.has_value()) {
    res.set_header("WWW-Authenticate", "Bearer realm=\"shoal-console\"");
    SendError(res, absl::UnauthenticatedError("not logged in: log in with a console token, or send "
                                              "`Authorization: Bearer TOKEN`"));
    return std::nullopt;
  }
  if (admin && *role != Role::kAdmin) {
    SendError(res, absl::PermissionDeniedError("this needs an admin token (yours is a viewer's)"));
    return std::nullopt;
  }
  return role;
}

void ConsoleServer::Route() {
  httplib::Server& http = *http_;
  http.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
  });
  size_t count = 0;
  const Asset* assets = ConsoleAssets(&count);
  for (size_t i = 0; i < count; ++i) {
    const Asset* asset = &assets[i];
    auto serve = [asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char*>(asset->data), asset->size, asset->content_type);
    };
    http.Get(asset->path, serve);
    if (std::string(asset->path) == "/index.html") http.Get("/", serve);
  }
  http.Post("/api/login", [this](const auto& req, auto& res) { Login(req, res); });
  http.Post("/api/logout", [this](const auto& req, auto& res) { Logout(req, res); });
  http.Get("/api/whoami", [this](const auto& req, auto& res) {
    if (auto role = Authorize(req, res, false)) {
      SendJson(res, 200, absl::StrCat("{\"role\":\"", RoleName(*role), "\"}"));
    }
  });
  http.Get("/api/tasks", [this](const auto& req, auto& res) {
    if (Authorize(req, res, false)) Reply(api_.ListTasks(), res);
  });
  http.Post("/api/tasks", [this](const auto& req, auto& res) {
    if (Authorize(req, res, true)) Reply(api_.CreateTask(req.body), res, 201);
  });
  http.Get(R"(/api/tasks/([^/]+))", [this](const auto& req, auto& res) {
    if (Authorize(req, res, false)) Reply(api_.GetTask(req.matches[1]), res);
  });
  http.Post(R"(/api/tasks/([^/]+)/stop)", [this](const auto& req, auto& res) {
    if (Authorize(req, res, true)) Reply(api_.StopTask(req.matches[1]), res);
  });
  http.Delete(R"(/api/tasks/([^/]+))", [this](const auto& req, auto& res) {
    if (Authorize(req, res, true)) Reply(api_.DeleteTask(req.matches[1]), res);
  });
  http.Get(R"(/api/tasks/([^/]+)/events)",
           [this](const auto& req, auto& res) { Events(req, res); });
  http.Get(R"(/api/tasks/([^/]+)/model)", [this](const auto& req, auto& res) { Model(req, res); });
  http.Get("/api/nodes", [this](const auto& req, auto& res) {
    if (Authorize(req, res, false)) Reply(api_.ListNodes(), res);
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    SendJson(res, res.status,
             absl::StrCat("{\"error\":", JsonString(absl::StrCat(res.status, " ", req.path)), "}"));
  });
}

void ConsoleServer::Login(const httplib::Request& req, httplib::Response& res) {
  const std::string token(absl::StripAsciiWhitespace(req.body));
  if (token.empty()) {
    return SendError(res,
                     absl::InvalidArgumentError("token: empty (the request body is the token)"));
  }
  std::optional<Role> role = tokens_.Find(token);
  if (!role.has_value()) return SendError(res, absl::UnauthenticatedError("wrong token"));
  absl::StatusOr<std::string> id = sessions_.Create(*role);
  if (!id.ok()) return SendError(res, id.status());
  res.set_header("Set-Cookie",
                 absl::StrCat(kCookie, "=", *id, "; Path=/; HttpOnly; SameSite=Strict",
                              tls_ ? "; Secure" : ""));
  SendJson(res, 200, absl::StrCat("{\"role\":\"", RoleName(*role), "\"}"));
}

void ConsoleServer::Logout(const httplib::Request& req, httplib::Response& res) {
  sessions_.Remove(CookieValue(req, kCookie));
  res.set_header("Set-Cookie",
                 absl::StrCat(kCookie, "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"));
  SendJson(res, 200, "{}");
}

void ConsoleServer::Events(const httplib::Request& req, httplib::Response& res) {
  if (!Authorize(req, res, false)) return;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || watches_.size() >= kMaxEventStreams) {
      return SendError(res, absl::UnavailableError("too many event streams open; try again later"));
    }
  }
  absl::StatusOr<v1::ControlService::StubInterface*> serving = api_.StubServing(req.matches[1]);
  if (!serving.ok()) return SendError(res, serving.status());
  absl::StatusOr<std::unique_ptr<TaskWatch>> started =
      TaskWatch::Start(**serving, req.matches[1], absl::Seconds(10));
  if (!started.ok()) return SendError(res, started.status());
  std::shared_ptr<TaskWatch> watch = *std::move(started);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) watch->Cancel();
    watches_.insert(watch.get());
  }
  res.set_header("Cache-Control", "no-store");
  res.set_chunked_content_provider(
      "text/event-stream",
      [watch, keep_alive = keep_alive_](size_t, httplib::DataSink& sink) {
        TaskWatch::Event event = watch->Next(keep_alive);
        switch (event.kind) {
          case TaskWatch::Event::kStatus: {
            const std::string data = absl::StrCat("event: status\ndata: ", event.json, "\n\n");
            return sink.write(data.data(), data.size());
          }
          case TaskWatch::Event::kIdle:  // a comment: finds a closed connection
            return sink.write(": keep-alive\n\n", 14);
          case TaskWatch::Event::kEnd: {
            const std::string data = absl::StrCat(
                "event: end\ndata: {\"error\":", JsonString(std::string(event.ended.message())),
                "}\n\n");
            sink.write(data.data(), data.size());
            sink.done();
            return true;
          }
        }
        return false;
      },
      [this, watch](bool) {
        absl::MutexLock lock(&mu_);
        watches_.erase(watch.get());
      });
}

void ConsoleServer::Model(const httplib::Request& req, httplib::Response& res) {
  if (!Authorize(req, res, false)) return;
  std::optional<uint64_t> version;
  if (req.has_param("version")) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(req.get_param_value("version"), &v)) {
      return SendError(res, absl::InvalidArgumentError(absl::StrCat(
                                "version: not a number: '", req.get_param_value("version"), "'")));
    }
    version = v;
  }
  const std::string name = req.matches[1];
  absl::StatusOr<ConsoleApi::ModelFile> model = api_.GetModel(name, version);
  if (!model.ok()) return SendError(res, model.status());
  auto file = std::make_shared<ConsoleApi::ModelFile>(*std::move(model));
  res.set_header("Content-Disposition", absl::StrCat("attachment; filename=\"", name, "-v",
                                                     file->version, ".shoal-model\""));
  res.set_content_provider(
      file->size, "application/octet-stream",
      [file](size_t offset, size_t length, httplib::DataSink& sink) {
        char buffer[1 << 16];
        const size_t n = std::min(length, sizeof(buffer));
        const ssize_t got =
            ::pread(::fileno(file->file.get()), buffer, n, static_cast<off_t>(offset));
        if (got <= 0) return false;
        return sink.write(buffer, static_cast<size_t>(got));
      },
      [file](bool) {});
}

}  // namespace shoal::coordinator::console
