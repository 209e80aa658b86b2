#!/usr/bin/env python3
"""A small ostler client built from proto/ alone.

Creates a session, streams its events, answers the permission prompt it raises, prints
the result, then what the session runs with (GetSessionInfo) and its context use
(GetContextUsage). Exits 0 only when the turn succeeded, a permission prompt was seen and
answered, the answer was recorded by the daemon, and the session info lists its tools.

    python client.py --addr 127.0.0.1:7433 --cwd /some/dir "Create the file please"

The Python code for the API is generated from ../../proto at start-up with grpc_tools
(into ./gen), so nothing generated is checked in.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
GEN = os.path.join(HERE, "gen")

# The channel's options: events larger than gRPC's default 4 MiB receive limit
# (docs/api.md, Limits), and client keep-alive so that a connection that dies without a
# word (a network change) ends the stream within seconds instead of hanging.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 10000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def generate():
    """Run protoc (bundled with grpcio-tools) over proto/ostler/v1/*.proto."""
    os.makedirs(GEN, exist_ok=True)
    files = sorted(
        os.path.join("ostler", "v1", f)
        for f in os.listdir(os.path.join(PROTO, "ostler", "v1"))
        if f.endswith(".proto")
    )
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", PROTO,
         "--python_out", GEN, "--grpc_python_out", GEN, *files],
        check=True,
    )
    sys.path.insert(0, GEN)


def show_session_info(sessions, session_pb2, session_id, metadata):
    """What the session runs with (GetSessionInfo) and its context use (GetContextUsage,
    on releases that serve it: FAILED_PRECONDITION names the release otherwise)."""
    import grpc
    info = sessions.GetSessionInfo(
        session_pb2.GetSessionInfoRequest(session_id=session_id), metadata=metadata, timeout=30)
    models = [m.value for m in info.initialized.models]
    print(f"session info: Claude Code {info.cli_version}, model {info.model}, "
          f"{len(info.tools)} tools, models offered: {', '.join(models) or '-'}")
    try:
        usage = sessions.GetContextUsage(
            session_pb2.GetContextUsageRequest(session_id=session_id), metadata=metadata,
            timeout=30)
        print(f"context: {usage.total_tokens} of {usage.max_tokens} tokens")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
            print(f"FAILED: GetContextUsage: {e.code().name}: {e.details()}", file=sys.stderr)
            return False
        print(f"context: not served by this release ({e.details()})")
    return bool(info.tools)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", default="Create the file please")
    p.add_argument("--addr", default=os.environ.get("OSTLER_ADDR", "127.0.0.1:7433"))
    p.add_argument("--token", default=os.environ.get("OSTLER_TOKEN"))
    p.add_argument("--cwd", default=os.getcwd())
    p.add_argument("--deny", action="store_true", help="deny the prompt instead of allowing it")
    args = p.parse_args()

    generate()
    import grpc
    from ostler.v1 import events_pb2, session_pb2, session_pb2_grpc

    # Bearer token (when the daemon has auth on) and a client name, on every call.
    metadata = [("x-ostler-client", "python-example")]
    if args.token:
        metadata.append(("authorization", "Bearer " + args.token))

    channel = grpc.insecure_channel(args.addr, options=CHANNEL_OPTIONS)
    sessions = session_pb2_grpc.SessionServiceStub(channel)

    session = sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            cwd=os.path.abspath(args.cwd),
            first_prompt=session_pb2.MessageContent(text=args.prompt),
            labels={"example": "python"},
        ),
        metadata=metadata,
        timeout=30,
    )
    print(f"session {session.id} ({events_pb2.SessionState.Name(session.state)})")

    answered = None
    recorded = None
    last_seq = 0
    # follow=True: replay from after_seq, then live. A client that loses the stream
    # resubscribes with after_seq=last_seq and sees every stored event exactly once.
    stream = sessions.Subscribe(
        session_pb2.SubscribeRequest(session_id=session.id, after_seq=0, follow=True),
        metadata=metadata,
    )
    try:
        for ev in stream:
            if ev.seq:
                last_seq = ev.seq
            kind = ev.WhichOneof("payload")
            if kind == "assistant_block" and ev.assistant_block.WhichOneof("block") == "text":
                print("assistant:", ev.assistant_block.text.text)
            elif kind == "assistant_block" and ev.assistant_block.WhichOneof("block") == "tool_use":
                tu = ev.assistant_block.tool_use
                print(f"tool call: {tu.name} {tu.input_json}")
            elif kind == "permission_requested":
                req = ev.permission_requested
                tool_input = json.loads(req.input_json or "{}")
                print(f"permission asked: {req.tool_name} {tool_input} -> "
                      + ("deny" if args.deny else "allow"))
                if args.deny:
                    decision = dict(deny=session_pb2.PermissionDeny(message="Not from the Python example."))
                else:
                    decision = dict(allow=session_pb2.PermissionAllow())
                try:
                    resp = sessions.RespondToPermission(
                        session_pb2.RespondToPermissionRequest(
                            session_id=session.id, request_id=req.request_id, **decision),
                        metadata=metadata,
                        timeout=30,
                    )
                    answered = req.request_id
                    print(f"answer recorded at seq {resp.seq}: "
                          f"{events_pb2.Resolution.Name(resp.resolved.resolution)}")
                except grpc.RpcError as e:
                    # FAILED_PRECONDITION: someone else answered first. NOT_FOUND: withdrawn.
                    print(f"answer refused: {e.code().name}: {e.details()}")
            elif kind == "permission_resolved":
                r = ev.permission_resolved
                if r.request_id == answered:
                    recorded = events_pb2.Resolution.Name(r.resolution)
                print(f"permission {events_pb2.Resolution.Name(r.resolution)} by {r.resolved_by}")
            elif kind == "tool_result":
                print("tool result:", "error" if ev.tool_result.is_error else "ok")
            elif kind == "turn_completed":
                t = ev.turn_completed
                print(f"result: {t.subtype} after {t.num_turns} turns, "
                      f"${t.total_cost_usd:.4f}: {t.result}")
                ok = (t.subtype == "success" and not t.is_error and answered is not None
                      and recorded is not None)
                if not ok:
                    print(f"FAILED: subtype={t.subtype} is_error={t.is_error} "
                          f"answered={answered} recorded={recorded}", file=sys.stderr)
                stream.cancel()
                if ok:
                    ok = show_session_info(sessions, session_pb2, session.id, metadata)
                return 0 if ok else 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            print(f"stream failed after seq {last_seq}: {e.code().name}: {e.details()}",
                  file=sys.stderr)
            return 1
    print("FAILED: the stream ended before the turn completed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
