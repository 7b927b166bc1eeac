"""The one exception the client raises."""

import grpc


class ShoalError(Exception):
    """A call that failed: `code` is the gRPC status code's name ("NOT_FOUND",
    "INVALID_ARGUMENT", "UNAVAILABLE", ...) and `message` the coordinator's message, which names
    the field, task or file that is wrong. Errors found before a call (a task file that cannot be
    read or parsed) use the same codes: "NOT_FOUND" for a missing file, "INVALID_ARGUMENT" for bad
    content."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def from_rpc_error(error: grpc.RpcError) -> ShoalError:
    """The ShoalError of a failed gRPC call."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    return ShoalError(code.name if code is not None else "UNKNOWN", details or str(error))
