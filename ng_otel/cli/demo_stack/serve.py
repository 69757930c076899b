"""Run one server of the stack on an already listening socket:
python -m ng_otel.cli.demo_stack.serve model --fd 3"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn

from ng_otel.cli.demo_stack.servers import agent_app, model_app, resources_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("server", choices=["model", "agent", "resources"])
    parser.add_argument("--fd", type=int, required=True, help="an already listening socket")
    parser.add_argument("--model-url")
    parser.add_argument("--resources-url")
    args = parser.parse_args()
    if args.server == "model":
        app = model_app()
    elif args.server == "resources":
        app = resources_app()
    else:
        app = agent_app(args.model_url, args.resources_url)
    sock = socket.socket(fileno=args.fd)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    try:
        asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    except KeyboardInterrupt:  # SIGINT is how the parent stops us; atexit then flushes telemetry
        pass


if __name__ == "__main__":
    main()
