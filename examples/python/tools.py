#!/usr/bin/env python3
"""Give a session a tool the client runs itself (client-hosted tools, issue 11).

Creates a session with a `tickets` tool server declaring `lookup_ticket`, asks the model to
look up a ticket, answers the model's ToolCallRequested with RespondToToolCall (the tool's
result as text), and checks that the turn ends successfully with the call resolved by this
client. (A PreToolUse hook that denies `rm -rf` is the other half of issue 11's example;
it needs remote hooks, which are not part of this branch.)

    python tools.py --addr 127.0.0.1:7433 --cwd /some/dir

Generates the API code from ../../proto like client.py.
"""
import argparse
import json
import os
import sys

from client import generate

TICKETS = {"PY-7": "open: the printer is on fire (reported by the python example)"}


def lookup_ticket(arguments):
    """The tool itself: runs here, in the client, not in the daemon or the CLI."""
    ticket = TICKETS.get(arguments.get("id", ""))
    if ticket is None:
        return None
    return f"{arguments['id']}: {ticket}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", default="Look up ticket PY-7 please")
    p.add_argument("--addr", default=os.environ.get("OSTLER_ADDR", "127.0.0.1:7433"))
    p.add_argument("--token", default=os.environ.get("OSTLER_TOKEN"))
    p.add_argument("--cwd", default=os.getcwd())
    args = p.parse_args()

    generate()
    import grpc
    from ostler.v1 import events_pb2, session_pb2, session_pb2_grpc

    metadata = [("x-ostler-client", "python-tools-example")]
    if args.token:
        metadata.append(("authorization", "Bearer " + args.token))
    sessions = session_pb2_grpc.SessionServiceStub(grpc.insecure_channel(args.addr))

    tickets = session_pb2.ToolServer(
        name="tickets",
        tools=[session_pb2.ToolDefinition(
            name="lookup_ticket",
            description="Look up a support ticket by its id",
            input_schema_json=json.dumps({
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
            }),
        )],
        timeout_secs=60,
    )
    session = sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            cwd=os.path.abspath(args.cwd),
            first_prompt=session_pb2.MessageContent(text=args.prompt),
            labels={"example": "python-tools"},
            tool_servers=[tickets],
            # Without this the CLI asks permission for the tool first, like for any tool.
            allowed_tools=["mcp__tickets__lookup_ticket"],
        ),
        metadata=metadata,
        timeout=30,
    )
    print(f"tools session {session.id}")

    resolved_by = None
    stream = sessions.Subscribe(
        session_pb2.SubscribeRequest(session_id=session.id, after_seq=0, follow=True),
        metadata=metadata,
    )
    try:
        for ev in stream:
            kind = ev.WhichOneof("payload")
            if kind == "tool_call_requested":
                call = ev.tool_call_requested
                arguments = json.loads(call.arguments_json or "{}")
                print(f"tool call: {call.server_name}.{call.tool_name} {arguments}")
                text = lookup_ticket(arguments)
                content = [events_pb2.ToolContent(text=text or f"no ticket {arguments.get('id')!r}")]
                try:
                    resp = sessions.RespondToToolCall(
                        session_pb2.RespondToToolCallRequest(
                            session_id=session.id, request_id=call.request_id,
                            content=content, is_error=text is None),
                        metadata=metadata,
                        timeout=30,
                    )
                    print(f"tool result recorded at seq {resp.seq}")
                except grpc.RpcError as e:
                    # FAILED_PRECONDITION: another client answered first (or it expired).
                    print(f"tool result refused: {e.code().name}: {e.details()}")
            elif kind == "tool_call_resolved":
                r = ev.tool_call_resolved
                resolved_by = r.resolved_by
                print(f"tool call {events_pb2.Resolution.Name(r.resolution)} by {r.resolved_by}")
            elif kind == "assistant_block" and ev.assistant_block.WhichOneof("block") == "text":
                print("assistant:", ev.assistant_block.text.text)
            elif kind == "turn_completed":
                t = ev.turn_completed
                print(f"tools result: {t.subtype}: {t.result}")
                stream.cancel()
                ok = (t.subtype == "success" and not t.is_error
                      and resolved_by == "client:python-tools-example")
                if not ok:
                    print(f"FAILED: subtype={t.subtype} resolved_by={resolved_by}", file=sys.stderr)
                return 0 if ok else 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            print(f"stream failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    print("FAILED: the stream ended before the turn completed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
