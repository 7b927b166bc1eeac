#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class ServerContextBase;
}

namespace shoal::rpc {

// Transport security of one process. Mutual TLS with the files of `dir` (ca.crt, tls.crt,
// tls.key: the layout scripts/gen-certs writes and a Kubernetes TLS secret holds), or plaintext
// when `insecure` is set. Exactly one of the two must be chosen: there is no silent default.
struct TlsOptions {
  std::string dir;        // --tls-dir
  bool insecure = false;  // --insecure

  // Checks the choice and that the TLS files are readable PEM. Errors name the flag:
  // "--tls-dir: ...".
  absl::Status Validate() const;
};

// The PEM files of a TLS directory, read and checked once at start.
struct TlsFiles {
  std::string ca;    // trusted CA certificate(s)
  std::string cert;  // this process's certificate chain
  std::string key;   // its private key
};

// Reads DIR/ca.crt, DIR/tls.crt and DIR/tls.key. Errors name the flag and the file.
absl::StatusOr<TlsFiles> LoadTlsFiles(const std::string& dir);

// Credentials for servers and channels. With TLS, servers require and verify a client
// certificate signed by the same CA (mutual TLS); channels present their own certificate and
// verify the server's against the CA and the address's host name.
class Credentials {
 public:
  static absl::StatusOr<Credentials> Create(const TlsOptions& options);
  // Plaintext both ways (tests in one process).
  static Credentials Insecure();

  bool secure() const { return secure_; }
  std::shared_ptr<grpc::ServerCredentials> server() const { return server_; }
  std::shared_ptr<grpc::ChannelCredentials> channel() const { return channel_; }

 private:
  bool secure_ = false;
  std::shared_ptr<grpc::ServerCredentials> server_;
  std::shared_ptr<grpc::ChannelCredentials> channel_;
};

// The common name of the verified client certificate of a call, or "" for a plaintext call.
std::string CallerIdentity(const grpc::ServerContextBase& context);

}  // namespace shoal::rpc
