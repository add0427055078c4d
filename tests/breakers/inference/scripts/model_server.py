"""A tiny HTTP model server with the SDK's inference mode: one replica.

    python model_server.py NAME PORT

POST /predict {"x": 1.5} -> {"replica", "pid", "output": 3.0}; GET /health (the replica's
health); POST /poison: from now on the model answers NaN (the fault the test injects).
"""

import json
import math
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from brakeline.inference import OutputWatch, Replica

name, port = sys.argv[1], int(sys.argv[2])
watch = OutputWatch(window=10, max_bad=0)
replica = Replica(name, backend="models", health=watch.health, interval=0.5)
watch.on_change = replica.poke  # a change of health is reported at once
# A replica the console sees on another host (it cannot signal it): it restarts itself.
replica.hostname = os.environ.get("REPLICA_HOSTNAME", replica.hostname)
poisoned = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, body):
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/poison":
            poisoned.set()
            return self._send(200, {"poisoned": True})
        if self.path != "/predict":
            return self._send(404, {})
        x = float(json.loads(data or b"{}").get("x", 1.0))
        output = math.nan if poisoned.is_set() else 2.0 * x
        watch.observe(output)
        shown = output if math.isfinite(output) else "NaN"
        return self._send(200, {"replica": name, "pid": os.getpid(), "output": shown})

    def do_GET(self):
        if self.path == "/health":
            return self._send(*replica.health_response())
        return self._send(404, {})


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
replica.start()
print(f"replica {name} serving on {port} as {os.getpid()}", flush=True)
server.serve_forever()
