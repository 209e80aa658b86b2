#!/usr/bin/env python3
"""Give a session a tool the client runs itself, and guard its Bash calls with a hook
(client-hosted tools and remote hooks, issue 11).

Creates a session with a `tickets` tool server declaring `lookup_ticket` and a PreToolUse
hook on Bash answered by this client. Asks the model to look up a ticket; answers the
model's ToolCallRequested with RespondToToolCall (the tool's result as text); answers each
HookRequested with RespondToHook: DENY for a command containing `rm -rf` (the tool does not
run; the reason reaches the model), CONTINUE otherwise. Checks that the turn ends
successfully with the call and the denial both made by this client.

    python tools.py --addr 127.0.0.1:7433 --cwd /some/dir

Generates the API code from ../../proto like client.py.
"""
import argparse
import json
import os
import sys

from client import CHANNEL_OPTIONS, generate

TICKETS = {"PY-7": "open: the printer is on fire (reported by the python example)"}


def lookup_ticket(arguments):
    """The tool itself: runs here, in the client, not in the daemon or the CLI."""
    ticket = TICKETS.get(arguments.get("id", ""))
    if ticket is None:
        return None
    return f"{arguments['id']}: {ticket}"


def guard_bash(hook_input):
    """The hook itself: (decision, reason) for a Bash call the CLI is about to run."""
    command = (hook_input.get("tool_input") or {}).get("command", "")
    if "rm -rf" in command:
        return "HOOK_DECISION_DENY", f"`{command}` is not allowed from this session"
    return "HOOK_DECISION_CONTINUE", ""


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
    # client.py's channel options: the receive limit and keep-alive.
    channel = grpc.insecure_channel(args.addr, options=CHANNEL_OPTIONS)
    sessions = session_pb2_grpc.SessionServiceStub(channel)

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
            # Bash calls wait for this client's answer (60 s, then the default: deny).
            hooks=[session_pb2.HookRegistration(
                id="no-rm-rf", event="PreToolUse", matcher="Bash", timeout_secs=60,
                default_decision=events_pb2.HOOK_DECISION_DENY,
                default_reason="nobody answered the guard hook")],
            # Without this the CLI asks permission for the tool first, like for any tool.
            allowed_tools=["mcp__tickets__lookup_ticket"],
        ),
        metadata=metadata,
        timeout=30,
    )
    print(f"tools session {session.id}")

    resolved_by = None
    denied_by = None
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
            elif kind == "hook_requested":
                h = ev.hook_requested
                hook_input = json.loads(h.input_json or "{}")
                decision, reason = guard_bash(hook_input)
                print(f"hook {h.hook_event} ({h.registration_id}) on {h.tool_name}: "
                      f"{(hook_input.get('tool_input') or {}).get('command')!r} -> {decision}")
                try:
                    resp = sessions.RespondToHook(
                        session_pb2.RespondToHookRequest(
                            session_id=session.id, request_id=h.request_id,
                            decision=events_pb2.HookDecision.Value(decision), reason=reason),
                        metadata=metadata,
                        timeout=30,
                    )
                    print(f"hook answer recorded at seq {resp.seq}")
                except grpc.RpcError as e:
                    # FAILED_PRECONDITION: another client answered first (or its default).
                    print(f"hook answer refused: {e.code().name}: {e.details()}")
            elif kind == "hook_resolved":
                r = ev.hook_resolved
                name = events_pb2.HookDecision.Name(r.decision)
                if name == "HOOK_DECISION_DENY":
                    denied_by = r.resolved_by
                print(f"hook {name} by {r.resolved_by}")
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
                      and resolved_by == "client:python-tools-example"
                      and denied_by == "client:python-tools-example")
                if not ok:
                    print(f"FAILED: subtype={t.subtype} tool call resolved_by={resolved_by} "
                          f"hook denied_by={denied_by}", file=sys.stderr)
                return 0 if ok else 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            print(f"stream failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    print("FAILED: the stream ended before the turn completed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
