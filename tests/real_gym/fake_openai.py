"""A local OpenAI-compatible endpoint that fails on cue, for Gym's stock model servers.

    python fake_openai.py PORT REQUEST_LOG

``GET /v1/models`` (Gym probes it before starting), ``POST /v1/responses`` (the policy, as
``openai_model`` calls it) and ``POST /v1/chat/completions`` (simpleqa's judge). The answer is
"Paris" for the policy and "A" (CORRECT) for the judge, unless the request body holds a cue:

    FAIL500    answer 500 {"error": {"message": "backend overloaded"}}
    FAIL503    answer 503 with the same body
    DROPTWICE  close the connection on the first two copies of a body, then answer
    DROP       close the connection every time (a model server that drops connections)

Every request is one JSON line in REQUEST_LOG: time, path, cue, what was done.
"""

import json
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CUES = ("FAIL500", "FAIL503", "DROPTWICE", "DROP")  # DROPTWICE before DROP, which it contains
ERROR = json.dumps({"error": {"message": "backend overloaded"}}).encode()
_lock = threading.Lock()
_copies: Counter[bytes] = Counter()


def responses_body(model: str) -> dict:
    message = {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Paris", "annotations": []}],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 11,
    }
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def chat_body(model: str) -> dict:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "A"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def note(self, **fields):
        fields["t"] = time.time()
        with _lock, open(sys.argv[2], "a") as log:
            log.write(json.dumps(fields) + "\n")

    def answer(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self.answer(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode())

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        text = raw.decode("utf-8", "replace")
        cue = next((c for c in CUES if c in text), None)
        path = self.path.split("?", 1)[0]
        with _lock:
            _copies[raw] += 1
            copy = _copies[raw]
        if cue == "DROP" or (cue == "DROPTWICE" and copy <= 2):
            self.note(path=path, cue=cue, done="dropped", traceparent=self.headers.get("traceparent"))
            self.close_connection = True
            self.connection.shutdown(2)
            return
        status = {"FAIL500": 500, "FAIL503": 503}.get(cue or "", 200)
        self.note(path=path, cue=cue, done=status, traceparent=self.headers.get("traceparent"))
        if status != 200:
            return self.answer(status, ERROR)
        model = json.loads(raw or b"{}").get("model", "fake")
        body = chat_body(model) if path.endswith("/chat/completions") else responses_body(model)
        self.answer(200, json.dumps(body).encode())


class Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: Gym dispatches every rollout at once, each
    # model request on a connection of its own (HTTP/1.0), and connections past the backlog
    # waited for the kernel's SYN retries (1, 3, 7, 15 s): seconds-long stragglers that were
    # this endpoint's, not Gym's (bench/gym_run.py measures rollouts/s through it).
    request_queue_size = 4096


if __name__ == "__main__":
    server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
