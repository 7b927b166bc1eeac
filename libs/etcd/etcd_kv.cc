#include "libs/etcd/etcd_kv.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"

namespace shoal::etcd {

// One channel to a member and its stubs.
struct EtcdKv::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
};

namespace {

bool Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

// A member's channel is replaced after each failure that says it was unreachable, so that a
// member that comes back is used again on the next call (a channel whose connection failed
// waits out gRPC's reconnect backoff, seconds, before it tries again).
struct EtcdKv::Member {
  // A channel without retries (a member that refuses connections answers at once, so the call
  // moves on to the next member) and with a subchannel of its own: a fresh channel connects at
  // once instead of inheriting a failed one's reconnect backoff from gRPC's shared pool.
  static std::shared_ptr<const Stubs> Dial(
      const std::string& endpoint, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    auto stubs = std::make_shared<Stubs>();
    stubs->channel = grpc::CreateCustomChannel(
        endpoint, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
    stubs->kv = etcdserverpb::KV::NewStub(stubs->channel);
    stubs->maintenance = etcdserverpb::Maintenance::NewStub(stubs->channel);
    stubs->lease = etcdserverpb::Lease::NewStub(stubs->channel);
    return stubs;
  }

  Member(std::string e, std::shared_ptr<grpc::ChannelCredentials> c)
      : endpoint(std::move(e)), credentials(std::move(c)), stubs(Dial(endpoint, credentials)) {}
  std::shared_ptr<const Stubs> Get() {
    absl::MutexLock lock(&mu);
    return stubs;
  }
  void Reconnect(const std::shared_ptr<const Stubs>& failed) {
    absl::MutexLock lock(&mu);
    if (stubs == failed) stubs = Dial(endpoint, credentials);
  }

  const std::string endpoint;
  const std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  absl::Mutex mu;
  std::shared_ptr<const Stubs> stubs ABSL_GUARDED_BY(mu);
};

EtcdKv::EtcdKv(std::vector<std::string> endpoints, absl::Duration call_timeout,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials)
    : endpoints_(std::move(endpoints)), call_timeout_(call_timeout) {
  for (const std::string& endpoint : endpoints_) {
    members_.push_back(std::make_unique<Member>(endpoint, credentials));
  }
}

EtcdKv::~EtcdKv() = default;

absl::StatusOr<std::unique_ptr<EtcdKv>> EtcdKv::Connect(
    std::vector<std::string> endpoints, absl::Duration connect_timeout, absl::Duration call_timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoint");
  for (const std::string& endpoint : endpoints) {
    if (endpoint.empty()) return absl::InvalidArgumentError("etcd: an empty endpoint");
  }
  std::unique_ptr<EtcdKv> kv(new EtcdKv(std::move(endpoints), call_timeout, credentials));
  const absl::Time deadline = absl::Now() + connect_timeout;
  absl::Status last;
  do {
    last = kv->OnAnyMember("status", [&](const Stubs& m, grpc::ClientContext& context) {
      etcdserverpb::StatusRequest request;
      etcdserverpb::StatusResponse response;
      return m.maintenance->Status(&context, request, &response);
    });
    if (last.ok()) return kv;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return last;
}

template <typename Call>
absl::Status EtcdKv::OnAnyMember(absl::string_view what, Call call, absl::Duration timeout) {
  size_t first;
  {
    absl::MutexLock lock(&mu_);
    first = current_;
  }
  std::vector<std::string> failures;
  for (size_t i = 0; i < members_.size(); ++i) {
    const size_t index = (first + i) % members_.size();
    Member& member = *members_[index];
    const std::shared_ptr<const Stubs> stubs = member.Get();
    grpc::ClientContext context;
    rpc::SetTimeout(context, timeout > absl::ZeroDuration() ? timeout : call_timeout_);
    const grpc::Status status = call(*stubs, context);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      current_ = index;
      return absl::OkStatus();
    }
    if (!Unreachable(status)) {
      const absl::Status error = rpc::FromGrpcStatus(status);
      return absl::Status(error.code(), absl::StrCat("etcd ", what, " at ", member.endpoint, ": ",
                                                     error.message()));
    }
    member.Reconnect(stubs);
    failures.push_back(absl::StrCat(member.endpoint, ": ", status.error_message()));
  }
  return absl::UnavailableError(
      absl::StrCat("etcd ", what, ": no member answered (", absl::StrJoin(failures, "; "), ")"));
}

absl::Status EtcdKv::FencedWrite(absl::string_view what, const Fence& fence,
                                 const std::vector<etcdserverpb::RequestOp>& ops) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* held = request.add_compare();
  held->set_key(fence.key);
  held->set_target(etcdserverpb::Compare::LEASE);
  held->set_result(etcdserverpb::Compare::EQUAL);
  held->set_lease(fence.lease);
  for (const etcdserverpb::RequestOp& op : ops) *request.add_success() = op;
  etcdserverpb::TxnResponse response;
  absl::Status s = OnAnyMember(what, [&](const Stubs& m, grpc::ClientContext& context) {
    response.Clear();
    return m.kv->Txn(&context, request, &response);
  });
  if (!s.ok()) return s;
  if (!response.succeeded()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd ", what, ": ", fence.key,
                                                      " is no longer held under lease ",
                                                      absl::Hex(fence.lease), "; nothing written"));
  }
  return absl::OkStatus();
}

absl::Status EtcdKv::Put(absl::string_view key, absl::string_view value, const Fence* fence) {
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  if (fence != nullptr) {
    etcdserverpb::RequestOp op;
    *op.mutable_request_put() = request;
    return FencedWrite("put", *fence, {op});
  }
  return OnAnyMember("put", [&](const Stubs& m, grpc::ClientContext& context) {
    etcdserverpb::PutResponse response;
    return m.kv->Put(&context, request, &response);
  });
}

absl::StatusOr<std::vector<KeyValue>> EtcdKv::Range(const RangeQuery& query) {
  etcdserverpb::RangeRequest request;
  request.set_key(query.start);
  request.set_range_end(query.end);
  request.set_limit(query.limit);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  request.set_sort_order(query.descending ? etcdserverpb::RangeRequest::DESCEND
                                          : etcdserverpb::RangeRequest::ASCEND);
  etcdserverpb::RangeResponse response;
  absl::Status s = OnAnyMember("range", [&](const Stubs& m, grpc::ClientContext& context) {
    response.Clear();
    return m.kv->Range(&context, request, &response);
  });
  if (!s.ok()) return s;
  std::vector<KeyValue> out;
  out.reserve(response.kvs_size());
  for (mvccpb::KeyValue& kv : *response.mutable_kvs()) {
    out.push_back({std::move(*kv.mutable_key()), std::move(*kv.mutable_value()), kv.lease()});
  }
  return out;
}

absl::Status EtcdKv::DeleteRange(absl::string_view start, absl::string_view end,
                                 const Fence* fence) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(start));
  request.set_range_end(std::string(end));
  if (fence != nullptr) {
    etcdserverpb::RequestOp op;
    *op.mutable_request_delete_range() = request;
    return FencedWrite("delete", *fence, {op});
  }
  return OnAnyMember("delete", [&](const Stubs& m, grpc::ClientContext& context) {
    etcdserverpb::DeleteRangeResponse response;
    return m.kv->DeleteRange(&context, request, &response);
  });
}

absl::Status EtcdKv::DeleteRanges(const std::vector<KeyRange>& ranges, const Fence& fence) {
  std::vector<etcdserverpb::RequestOp> ops(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    etcdserverpb::DeleteRangeRequest* d = ops[i].mutable_request_delete_range();
    d->set_key(ranges[i].start);
    d->set_range_end(ranges[i].end);
  }
  return FencedWrite("delete", fence, ops);
}

absl::StatusOr<int64_t> EtcdKv::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status s = OnAnyMember("lease grant", [&](const Stubs& m, grpc::ClientContext& context) {
    return m.lease->LeaseGrant(&context, request, &response);
  });
  if (!s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd lease grant: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> EtcdKv::KeepAlive(int64_t lease, absl::string_view confirm_key,
                                                 absl::Duration per_member) {
  // One renewal on etcd's keep-alive stream: write the request, read its answer, close.
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = OnAnyMember(
      "lease keep-alive",
      [&](const Stubs& m, grpc::ClientContext& context) {
        auto stream = m.lease->LeaseKeepAlive(&context);
        etcdserverpb::LeaseKeepAliveRequest request;
        request.set_id(lease);
        response.Clear();
        if (!stream->Write(request) || !stream->Read(&response)) {
          stream->WritesDone();
          grpc::Status status = stream->Finish();
          return status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed")
                             : status;
        }
        stream->WritesDone();
        context.TryCancel();  // etcd keeps the stream open for more renewals
        stream->Finish();
        // Only a member in the quorum's term renews for real (see the header): a linearizable
        // read (ReadIndex) proves it, within what is left of this member's time.
        grpc::ClientContext quorum;
        quorum.set_deadline(context.deadline());
        etcdserverpb::RangeRequest probe;
        probe.set_key(std::string(confirm_key));
        probe.set_count_only(true);
        etcdserverpb::RangeResponse ignored;
        return m.kv->Range(&quorum, probe, &ignored);
      },
      per_member);
  if (!s.ok()) return s;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", absl::Hex(lease), " has expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdKv::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  return OnAnyMember("lease revoke", [&](const Stubs& m, grpc::ClientContext& context) {
    etcdserverpb::LeaseRevokeResponse response;
    return m.lease->LeaseRevoke(&context, request, &response);
  });
}

absl::StatusOr<std::string> EtcdKv::CreateIfAbsent(absl::string_view key, absl::string_view value,
                                                   int64_t lease) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(std::string(key));
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(std::string(key));
  etcdserverpb::TxnResponse response;
  absl::Status s = OnAnyMember("create", [&](const Stubs& m, grpc::ClientContext& context) {
    response.Clear();
    return m.kv->Txn(&context, request, &response);
  });
  if (!s.ok()) return s;
  if (response.succeeded()) return std::string(value);
  if (response.responses_size() == 1 && response.responses(0).has_response_range() &&
      response.responses(0).response_range().kvs_size() == 1) {
    return response.responses(0).response_range().kvs(0).value();
  }
  // Deleted between the compare and the read (its lease expired): the caller tries again.
  return absl::UnavailableError(absl::StrCat("etcd create: ", key, " changed meanwhile"));
}

absl::StatusOr<bool> EtcdKv::PutIfNoneExist(const std::vector<std::string>& absent,
                                            absl::string_view key, absl::string_view value,
                                            int64_t lease) {
  etcdserverpb::TxnRequest request;
  for (const std::string& name : absent) {
    etcdserverpb::Compare* none = request.add_compare();
    none->set_key(name);
    none->set_target(etcdserverpb::Compare::CREATE);
    none->set_result(etcdserverpb::Compare::EQUAL);
    none->set_create_revision(0);
  }
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  etcdserverpb::TxnResponse response;
  absl::Status s = OnAnyMember("create", [&](const Stubs& m, grpc::ClientContext& context) {
    response.Clear();
    return m.kv->Txn(&context, request, &response);
  });
  if (!s.ok()) return s;
  return response.succeeded();
}

std::string EtcdKv::PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  // Every byte was 0xff: the range runs to the end of the key space.
  return std::string(1, '\0');
}

}  // namespace shoal::etcd
