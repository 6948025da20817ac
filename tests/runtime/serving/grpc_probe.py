"""Asks a gRPC server what any generic client would: its health
(grpc.health.v1.Health/Check) and its services (server reflection,
grpc.reflection.v1alpha). The messages are encoded by hand, so nothing but
Debian's python3-grpcio is needed.

  grpc_probe.py health ADDRESS [SERVICE]   -> SERVING / NOT_SERVING / ...
  grpc_probe.py services ADDRESS           -> one service name per line
"""
import sys

import grpc


def field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def read_fields(data):
    """(number, value) pairs of a message: varints as int, the rest as bytes."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 2:
            size, i = varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield number, value


def varint(data, i):
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def health(channel, service):
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    reply = check(field(1, service.encode()) if service else b"", timeout=10)
    status = dict(read_fields(reply)).get(1, 0)
    return ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"][status]


def services(channel):
    info = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    # ServerReflectionRequest{list_services = 7: ""}
    for reply in info(iter([field(7, b"")]), timeout=10):
        for number, value in read_fields(reply):
            if number == 6:  # list_services_response
                for _, service in read_fields(value):  # repeated ServiceResponse
                    yield dict(read_fields(service))[1].decode()


def main():
    command, address = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(address) as channel:
        try:
            if command == "health":
                print(health(channel, sys.argv[3] if len(sys.argv) > 3 else ""))
            else:
                print("\n".join(services(channel)))
        except grpc.RpcError as e:
            print(f"{e.code().name}: {e.details()}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
