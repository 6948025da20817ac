"""Asks a gRPC server what any generic client would: its health
(grpc.health.v1.Health/Check) and, through server reflection (VERSION v1 or
v1alpha), its services and the files that define a symbol. The messages are
encoded by hand, so nothing but Debian's python3-grpcio is needed.

  grpc_probe.py health ADDRESS [SERVICE]          -> SERVING / NOT_SERVING / ...
  grpc_probe.py services ADDRESS [VERSION]        -> one service name per line
  grpc_probe.py files ADDRESS VERSION NAME...     -> per name (a symbol, or a file
      if it ends in .proto), the files sent as `file NAME package PACKAGE`, or
      `error CODE MESSAGE`; then `--`
"""
import sys

import grpc


def field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    size, length = len(payload), b""
    while size >= 0x80:
        length += bytes([size & 0x7F | 0x80])
        size >>= 7
    return bytes([number << 3 | 2]) + length + bytes([size]) + payload


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


def reflect(channel, version, requests):
    """The replies to ServerReflectionRequests sent on one stream, each as
    (number, value) of its message_response."""
    info = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo")
    for reply in info(iter(requests), timeout=10):
        for number, value in read_fields(reply):
            if number in (4, 5, 6, 7):
                yield number, value


def services(channel, version):
    # ServerReflectionRequest{list_services = 7: ""}
    for number, value in reflect(channel, version, [field(7, b"")]):
        if number == 6:  # list_services_response
            for _, service in read_fields(value):  # repeated ServiceResponse
                yield dict(read_fields(service))[1].decode()


def files(channel, version, names):
    # ServerReflectionRequest{file_by_filename = 3 or file_containing_symbol = 4: NAME},
    # all on one stream
    requests = [field(3 if n.endswith(".proto") else 4, n.encode()) for n in names]
    for number, value in reflect(channel, version, requests):
        if number == 4:  # file_descriptor_response: repeated FileDescriptorProto
            for _, proto in read_fields(value):
                fields = dict(read_fields(proto))  # name = 1, package = 2
                yield f"file {fields[1].decode()} package {fields.get(2, b'').decode()}"
        elif number == 7:  # error_response: error_code = 1, error_message = 2
            fields = dict(read_fields(value))
            yield f"error {fields.get(1, 0)} {fields.get(2, b'').decode()}"
        yield "--"


def main():
    command, address = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(address) as channel:
        try:
            if command == "health":
                print(health(channel, sys.argv[3] if len(sys.argv) > 3 else ""))
            elif command == "services":
                version = sys.argv[3] if len(sys.argv) > 3 else "v1alpha"
                print("\n".join(services(channel, version)))
            else:
                print("\n".join(files(channel, sys.argv[3], sys.argv[4:])))
        except grpc.RpcError as e:
            print(f"{e.code().name}: {e.details()}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
