#include "libs/rpc/tls.h"

#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::rpc {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& dir, const std::string& file,
                                    const char* marker) {
  const std::string path = absl::StrCat(dir, "/", file);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--tls-dir: cannot read ", path,
                                            " (make certificates with scripts/gen-certs)"));
  }
  std::stringstream content;
  content << in.rdbuf();
  if (!absl::StrContains(content.str(), marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-dir: ", path, " is not a PEM file with a ", marker, " block"));
  }
  return content.str();
}

}  // namespace

absl::Status TlsOptions::Validate() const {
  if (insecure && !dir.empty()) {
    return absl::InvalidArgumentError("--insecure: cannot be combined with --tls-dir");
  }
  if (!insecure && dir.empty()) {
    return absl::InvalidArgumentError(
        "--tls-dir: required (a directory with ca.crt, tls.crt, tls.key from scripts/gen-certs), "
        "or --insecure for plaintext");
  }
  if (!insecure) return LoadTlsFiles(dir).status();
  return absl::OkStatus();
}

absl::StatusOr<TlsFiles> LoadTlsFiles(const std::string& dir) {
  TlsFiles files;
  SHOAL_ASSIGN_OR_RETURN(files.ca, ReadPem(dir, "ca.crt", "CERTIFICATE"));
  SHOAL_ASSIGN_OR_RETURN(files.cert, ReadPem(dir, "tls.crt", "CERTIFICATE"));
  SHOAL_ASSIGN_OR_RETURN(files.key, ReadPem(dir, "tls.key", "PRIVATE KEY"));
  return files;
}

absl::StatusOr<Credentials> Credentials::Create(const TlsOptions& options) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  if (options.insecure) return Insecure();
  SHOAL_ASSIGN_OR_RETURN(TlsFiles files, LoadTlsFiles(options.dir));
  Credentials c;
  c.secure_ = true;
  grpc::SslServerCredentialsOptions server(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = files.ca;
  server.pem_key_cert_pairs.push_back({files.key, files.cert});
  c.server_ = grpc::SslServerCredentials(server);
  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = files.ca;
  channel.pem_private_key = files.key;
  channel.pem_cert_chain = files.cert;
  c.channel_ = grpc::SslCredentials(channel);
  if (c.server_ == nullptr || c.channel_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-dir: ", options.dir, ": gRPC rejected the certificates"));
  }
  return c;
}

Credentials Credentials::Insecure() {
  Credentials c;
  c.server_ = grpc::InsecureServerCredentials();
  c.channel_ = grpc::InsecureChannelCredentials();
  return c;
}

std::string CallerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

}  // namespace shoal::rpc
