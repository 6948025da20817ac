#!/usr/bin/env python3
"""A small Python client of the deltaserve Generation API.

It shows how to call a `deltaserve serve` (or `deltaserve coordinator`) from
Python with grpcio and the stubs CMake generates from
proto/deltaserve/v1/generation.proto:

  generate  streams Generate and prints the text (or, with --ids, the token
            ids) as it arrives; finish reason, usage and timings go to stderr
  score     streams ScoreStream and prints `token_id logprob` per scored
            token; the total to stderr

While a long prompt is prefilled, both print the server's PrefillProgress
messages to stderr (`prefill: 1024/4096 tokens`) when stderr is a terminal
or with --progress.
  info      prints GetModelInfo
  status    prints GetServerStatus
  health    calls grpc.health.v1.Health/Check and prints SERVING or NOT_SERVING

    python3 examples/python/deltaserve_client.py generate \\
        --server 127.0.0.1:50051 --tokens 1,2,3,4,5 --max-tokens 20 --ids

or, installed with `pip install ./examples/python`, as `deltaserve-client generate ...`.
Any Python 3.8 or later with grpcio and protobuf >= 3.20 runs it.

A secured server (docs/security.md) takes the same flags as `deltaserve
client`: --tls-ca (and --tls-cert/--tls-key for mutual TLS) and --token-file
(sent as `authorization: Bearer TOKEN` on every call).

An RPC error prints `CODE_NAME: details` to stderr and exits with 1; bad usage
exits with 2.
"""

import argparse
import json
import os
import re
import sys

try:
    import grpc
except ImportError:
    sys.exit("deltaserve_client needs grpcio: `pip install grpcio protobuf` (or Debian's "
             "python3-grpcio), or `pip install ./examples/python`, which brings both")


FINISH_NAMES = {1: "length", 2: "stop", 3: "context"}
HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def token_list(text):
    """Parses `--tokens 1,2,3` (or "1 2 3", or both mixed) into [1, 2, 3], as deltaserve does."""
    items = [t for t in re.split(r"[,\s]+", text) if t]
    if not items:
        raise argparse.ArgumentTypeError("no token ids")
    try:
        return [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            "want token ids separated by commas or spaces, got %r" % text)


def max_tokens(text):
    """--max-tokens N, N >= 1: 0 would reach the server as unset (its default of 16)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("want a whole number, got %r" % text)
    if n < 1:
        raise argparse.ArgumentTypeError(
            "must be >= 1 (got %d); leave it out for the default 32" % n)
    return n


def read_file(path, what, secret=False, limit=1 << 20):
    try:
        if secret and os.stat(path).st_mode & 0o077:
            sys.exit("%s %s: group or others may read it; it holds a secret: chmod 600 %s" %
                     (what, path, path))
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            sys.exit("%s %s: larger than %d bytes" % (what, path, limit))
        return data
    except OSError as e:
        sys.exit("%s %s: %s" % (what, path, e.strerror))


def bearer_token(path):
    """The first token of a token file: `principal:token` or `token` lines, # comments."""
    for line in read_file(path, "--token-file", secret=True).decode().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line.split(":", 1)[-1]
    sys.exit("--token-file %s: holds no token" % path)


def connect(args):
    # No message size limits, as the C++ client: long prompts and scores are fine.
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if args.tls_server_name:
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    if bool(args.tls_cert) != bool(args.tls_key):
        sys.exit("give both --tls-cert and --tls-key, or neither")
    if not args.tls_ca:
        if args.tls_cert or args.tls_server_name:
            sys.exit("a client certificate or server name is for TLS: give --tls-ca too")
        return grpc.insecure_channel(args.server, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_file(args.tls_ca, "--tls-ca"),
        private_key=read_file(args.tls_key, "--tls-key", secret=True) if args.tls_key else None,
        certificate_chain=read_file(args.tls_cert, "--tls-cert") if args.tls_cert else None)
    return grpc.secure_channel(args.server, credentials, options=options)


def metadata(args):
    """Every call's metadata: the bearer token, when there is one."""
    return [("authorization", "Bearer " + args.token)] if args.token else []


MAX_INPUT_FILE_BYTES = 64 << 20  # as deltaserve's --prompt-file and --tokens-file


def read_conversation(path, pb):
    """--messages-file: OpenAI's `messages` JSON (a list), or an object with `messages` and
    optionally `tools` and `chat_template_kwargs`, as deltaserve client reads it. The shape is
    checked here; the server checks the rest (roles, sizes, what its chat format takes)."""
    def fail(what):
        sys.exit("--messages-file %s: %s" % (path, what))
    try:
        data = json.loads(read_file(path, "--messages-file", limit=MAX_INPUT_FILE_BYTES))
    except (UnicodeDecodeError, ValueError) as e:
        fail("not JSON: %s" % e)
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict):
        fail("must be a list of messages or an object")
    for key in data:
        if key not in ("messages", "tools", "chat_template_kwargs"):
            fail("%s: not a field of a conversation (messages, tools, chat_template_kwargs)" % key)
    if not isinstance(data.get("messages"), list):
        fail("messages: must be a list of messages")
    chat = pb.Chat()
    for i, m in enumerate(data["messages"]):
        where = "messages[%d]" % i
        if not isinstance(m, dict):
            fail(where + ": must be an object")
        message = chat.messages.add(role=str(m.get("role", "")))
        content = m.get("content")
        if isinstance(content, list):  # text parts, concatenated; the rest refused by name
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else part
                    fail("%s.content[%d].type: %s: this model takes text only" % (where, j, kind))
                message.content += str(part.get("text", ""))
        elif content is not None:
            if not isinstance(content, str):
                fail(where + ".content: must be a string or a list of text parts")
            message.content = content
        for field in ("reasoning_content", "tool_call_id", "name"):
            if m.get(field) is not None:
                setattr(message, field, str(m[field]))
        for j, call in enumerate(m.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                fail("%s.tool_calls[%d].function: required" % (where, j))
            arguments = function.get("arguments", "")
            message.tool_calls.add(id=str(call.get("id") or ""), name=str(function.get("name", "")),
                                   arguments=arguments if isinstance(arguments, str)
                                   else json.dumps(arguments))
    if data.get("tools"):
        chat.tools_json = json.dumps(data["tools"])
    kwargs = data.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        fail("chat_template_kwargs: must be an object")
    for key, value in kwargs.items():
        if key == "thinking" and isinstance(value, bool):
            chat.thinking = value
        elif key == "thinking_effort" and isinstance(value, str):
            chat.thinking_effort = value
        else:
            fail("chat_template_kwargs.%s: not a switch of deltaserve's chat formats "
                 "(thinking: true or false, thinking_effort: a string)" % key)
    return chat


def set_input(request, args, pb):
    """Fills the request's prompt/input oneof from --prompt, --prompt-file, --tokens,
    --tokens-file or --messages-file, as deltaserve client does."""
    if args.messages_file is not None:
        request.chat.CopyFrom(read_conversation(args.messages_file, pb))
    elif args.prompt is not None or args.prompt_file is not None:
        text = args.prompt
        if text is None:
            data = read_file(args.prompt_file, "--prompt-file", limit=MAX_INPUT_FILE_BYTES)
            try:
                text = data.decode()
            except UnicodeDecodeError as e:
                sys.exit("--prompt-file %s: not UTF-8 (byte %d)" % (args.prompt_file, e.start))
        if not text:
            sys.exit("%s is empty" % ("--prompt" if args.prompt is not None else
                                      "--prompt-file " + args.prompt_file))
        request.text = text
    elif args.tokens is not None:
        request.tokens.ids.extend(args.tokens)
    else:
        data = read_file(args.tokens_file, "--tokens-file", limit=MAX_INPUT_FILE_BYTES)
        try:
            request.tokens.ids.extend(token_list(data.decode()))
        except (UnicodeDecodeError, argparse.ArgumentTypeError) as e:
            sys.exit("--tokens-file %s: %s" % (args.tokens_file, e))


def show_progress(args, progress):
    """A PrefillProgress message, on stderr, when asked or at a terminal."""
    if args.progress or sys.stderr.isatty():
        print("prefill: %d/%d tokens" % (progress.tokens_done, progress.tokens_total),
              file=sys.stderr, flush=True)


def generate(args, pb, pb_grpc):
    request = pb.GenerateRequest(max_tokens=args.max_tokens, stop=args.stop or [])
    set_input(request, args, pb)
    request.sampling.temperature = args.temperature
    request.sampling.top_k = args.top_k
    request.sampling.seed = args.seed
    if args.top_p is not None:
        request.sampling.top_p = args.top_p
    with connect(args) as channel:
        stream = pb_grpc.GenerationStub(channel).Generate(request, timeout=args.timeout,
                                                                 metadata=metadata(args))
        completion = None
        printed = False
        try:
            for response in stream:
                if response.HasField("progress"):
                    show_progress(args, response.progress)
                for token in response.tokens:
                    if args.ids:  # as `deltaserve generate --ids`: "1 2 3" on one line
                        sys.stdout.write((" %d" if printed else "%d") % token.id)
                    else:
                        sys.stdout.write(token.text)
                    printed = True
                sys.stdout.flush()
                if response.HasField("completion"):
                    completion = response.completion
        except grpc.RpcError:
            if printed:  # end the started line, so the error starts its own
                print(flush=True)
            raise
        print(flush=True)
    if completion is not None:
        t = completion.timings
        print("finish: %s%s, prompt tokens: %d, generated: %d, queue: %.1f ms, "
              "time to first token: %.1f ms, total: %.1f ms" % (
                  FINISH_NAMES.get(completion.finish_reason, "unspecified"),
                  " at " + completion.stop if completion.stop else "",
                  completion.usage.prompt_tokens, completion.usage.completion_tokens,
                  t.queue_s * 1e3, t.time_to_first_token_s * 1e3, t.total_s * 1e3),
              file=sys.stderr)


def score(args, pb, pb_grpc):
    request = pb.ScoreRequest()
    set_input(request, args, pb)
    response = None
    with connect(args) as channel:
        for message in pb_grpc.GenerationStub(channel).ScoreStream(
                request, timeout=args.timeout, metadata=metadata(args)):
            if message.HasField("progress"):
                show_progress(args, message.progress)
            if message.HasField("result"):
                response = message.result
    if response is None:
        raise SystemExit("the server's ScoreStream ended without a result")
    # logprobs[i] is the log-prob of token_ids[i + 1]; the first token has none.
    for token_id, logprob in zip(response.token_ids[1:], response.logprobs):
        print("%d %.6f" % (token_id, logprob))
    print("tokens: %d, total log-prob: %.6f, time: %.1f ms" %
          (len(response.token_ids), response.total_logprob, response.timings.total_s * 1e3),
          file=sys.stderr)


def info(args, pb, pb_grpc):
    from google.protobuf import text_format
    with connect(args) as channel:
        stub = pb_grpc.GenerationStub(channel)
        if args.command == "info":
            response = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=args.timeout,
                                         metadata=metadata(args))
        else:
            response = stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=args.timeout,
                                            metadata=metadata(args))
    sys.stdout.write(text_format.MessageToString(response))


# grpc.health.v1 by hand, for when grpcio-health-checking (grpc_health) is not
# installed: HealthCheckRequest { string service = 1; } and
# HealthCheckResponse { ServingStatus status = 1; } are one field each.

def encode_varint(value):
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def decode_varint(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def encode_health_request(service):
    data = service.encode("utf-8")
    # Field 1, wire type 2 (length-delimited); proto3 leaves an empty string out.
    return b"\x0a" + encode_varint(len(data)) + data if data else b""


def decode_health_response(data):
    status, pos = 0, 0
    while pos < len(data):
        key, pos = decode_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = decode_varint(data, pos)
            if field == 1:
                status = value
        elif wire_type == 2:
            length, pos = decode_varint(data, pos)
            pos += length
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            raise ValueError("HealthCheckResponse: unexpected wire type %d" % wire_type)
    return status


def health(args, pb, pb_grpc):
    with connect(args) as channel:
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
        except ImportError:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=encode_health_request,
                                        response_deserializer=decode_health_response)
            status = check(args.service, timeout=args.timeout)
        else:
            stub = health_pb2_grpc.HealthStub(channel)
            status = stub.Check(health_pb2.HealthCheckRequest(service=args.service),
                                timeout=args.timeout).status
    print(HEALTH_NAMES.get(status, "UNKNOWN(%d)" % status))
    return 0 if status == 1 else 1


def parse_args(argv):
    parser = argparse.ArgumentParser(description="A Python client of the deltaserve API.")
    parser.add_argument("--stubs", metavar="DIR",
                        help="directory holding deltaserve/v1/*_pb2.py (default: the package "
                             "installed with this client, or the one beside this script)")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, help, timeout=None):
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--server", default="127.0.0.1:50051", metavar="HOST:PORT",
                         help="(default: %(default)s)")
        sub.add_argument("--timeout", type=float, default=timeout, metavar="SECONDS",
                         help="deadline in seconds (default: %s)" % (timeout or "none"))
        sub.add_argument("--tls-ca", metavar="F",
                         help="connect with TLS; the server's certificate must chain to this CA")
        sub.add_argument("--tls-cert", metavar="F", help="client certificate (mutual TLS)")
        sub.add_argument("--tls-key", metavar="F", help="its private key (mode 600)")
        sub.add_argument("--tls-server-name", metavar="NAME",
                         help="the name the server's certificate must carry")
        sub.add_argument("--token-file", metavar="F",
                         help="send its first token as `authorization: Bearer` (mode 600)")
        return sub

    def with_input(sub):
        group = sub.add_mutually_exclusive_group(required=True)
        group.add_argument("--prompt", metavar="TEXT", help="tokenized by the server")
        group.add_argument("--prompt-file", metavar="F",
                           help="the prompt's text from a file (UTF-8, up to 64 MiB)")
        group.add_argument("--tokens", type=token_list, metavar="1,2,3",
                           help="token ids, separated by commas or spaces")
        group.add_argument("--tokens-file", metavar="F",
                           help="token ids from a file, separated by commas or spaces")
        group.add_argument("--messages-file", metavar="F",
                           help="a conversation, rendered by the server's chat format: OpenAI's "
                                "`messages` JSON (a list), or {\"messages\": [...], \"tools\": "
                                "[...], \"chat_template_kwargs\": {\"thinking\": false}}")
        sub.add_argument("--progress", action="store_true",
                         help="print the prefill's progress to stderr even when it is not a "
                              "terminal")
        return sub

    gen = with_input(command("generate", "stream generated text or token ids"))
    gen.add_argument("--max-tokens", type=max_tokens, default=32, metavar="N",
                     help=">= 1 (default: 32)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy")
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="0: no limit")
    gen.add_argument("--top-p", type=float, metavar="P", help="in (0, 1]; unset: 1")
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="same seed, same tokens")
    gen.add_argument("--stop", nargs="+", action="extend", metavar="STR",
                     help="stop strings, not part of the output")
    gen.add_argument("--ids", action="store_true", help="print token ids, not text")
    with_input(command("score", "per-token log-probs of a text or token sequence"))
    command("info", "the model the server holds", timeout=10)
    command("status", "the server's queue and cache", timeout=10)
    command("health", "grpc.health.v1 Check", timeout=10).add_argument(
        "--service", default="", metavar="NAME", help="service name (default: the whole server)")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    args.token = bearer_token(args.token_file) if args.token_file else None
    if args.stubs:
        sys.path.insert(0, args.stubs)
    try:
        from deltaserve.v1 import generation_pb2, generation_pb2_grpc
    except ImportError as e:
        sys.exit("cannot import the deltaserve stubs from %s: %s" %
                 (args.stubs or "the deltaserve.v1 package", e))
    run = {"generate": generate, "score": score, "info": info, "status": info,
           "health": health}[args.command]
    try:
        return run(args, generation_pb2, generation_pb2_grpc) or 0
    except grpc.RpcError as e:
        sys.stdout.flush()
        print("%s: %s" % (e.code().name, e.details()), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # leaving the channel's `with` cancels the call
        return 130


def entry():
    """The `deltaserve-client` command of the installed package."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entry()
