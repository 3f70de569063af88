#!/usr/bin/env python3
"""A local stand-in for the model APIs the harness tests drive (stdlib only).

Answers the OpenAI Responses API (POST /v1/responses, server-sent events, as
Codex reads them), the Anthropic Messages API (POST /v1/messages, as Claude
Code reads it) and the OpenAI Chat Completions API (POST
/v1/chat/completions, as OpenCode's OpenAI-compatible providers read it).
Every request (its path, the count of its input items, the credential it
carried and its body) is appended, one JSON object a line, to the log file
given as the first argument; the port it listens on (127.0.0.1, chosen by
the kernel) is printed on stdout once it is ready. Each answer is a short
text naming how many input items the request carried, so a test can see
the history the harness sent.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = open(sys.argv[1], "a", encoding="utf-8")
LOCK = threading.Lock()


def sse(events):
    return "".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events
    ).encode()


def responses(body, n):
    text = f"ok, {n} input items"
    item = {"type": "message", "role": "assistant", "id": f"msg_{n}",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    usage = {"input_tokens": n, "output_tokens": 4, "total_tokens": n + 4,
             "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}
    rid = f"resp_{n}"
    return sse([
        ("response.created", {"type": "response.created", "response": {"id": rid}}),
        ("response.output_item.done", {"type": "response.output_item.done",
                                       "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed",
                                "response": {"id": rid, "usage": usage}}),
    ])


def messages(body, n):
    text = f"ok, {n} input items"
    msg = {"id": f"msg_{n}", "type": "message", "role": "assistant",
           "model": body.get("model", "mock"), "content": [],
           "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": n, "output_tokens": 1}}
    if not body.get("stream"):
        msg["content"] = [{"type": "text", "text": text}]
        msg["stop_reason"] = "end_turn"
        return "application/json", json.dumps(msg).encode()
    return "text/event-stream", sse([
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 4}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def chat(body, n):
    text = f"ok, {n} input items"
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk",
            "created": 0, "model": body.get("model", "mock")}
    usage = {"prompt_tokens": n, "completion_tokens": 4, "total_tokens": n + 4}
    if not body.get("stream"):
        return "application/json", json.dumps({
            **base, "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]}).encode()
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": usage},
    ]
    return "text/event-stream", ("".join(
        f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        # Model lists and update checks: nothing to offer.
        self.reply(200, "application/json", b'{"object":"list","data":[],"models":[]}')

    def do_HEAD(self):
        self.reply(200, "application/json", b"")

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        items = body.get("input") if path.endswith("/responses") else body.get("messages")
        n = len(items) if isinstance(items, list) else 0
        with LOCK:
            auth = self.headers.get("authorization") or self.headers.get("x-api-key")
            LOG.write(json.dumps({"path": path, "items": n, "auth": auth, "body": body}) + "\n")
            LOG.flush()
        if path.endswith("/responses"):
            self.reply(200, "text/event-stream", responses(body, n))
        elif path.endswith("/messages"):
            self.reply(200, *messages(body, n))
        elif path.endswith("/chat/completions"):
            self.reply(200, *chat(body, n))
        else:
            self.reply(200, "application/json", b"{}")

    def reply(self, code, ctype, data):
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
