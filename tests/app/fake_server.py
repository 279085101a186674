"""A stand-in for `tandem serve`, started by the tests as the local server's child: it takes
the same arguments, answers GET /health on 127.0.0.1 with the pair it was given (and whether
it got an API key), and fails as uvicorn does when its port is taken. No model is loaded."""
from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--pair", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    health = json.dumps({
        "status": "ok", "model": args.pair, "api_key": os.environ.get("TANDEM_API_KEY"), "pid": os.getpid(),
    }).encode()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(health)

        def log_message(self, *_args) -> None:
            pass

    try:
        server = HTTPServer((args.host, args.port), Health)
    except OSError as error:
        # uvicorn's words for the same failure
        print(f"ERROR:    [Errno {error.errno}] error while attempting to bind on address "
              f"('{args.host}', {args.port}): {error.strerror.lower()}", file=sys.stderr, flush=True)
        return 1
    print(f"  serving {args.pair} at http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
