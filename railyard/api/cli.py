"""`railyard serve`: one engine behind the OpenAI-compatible HTTP API (uvicorn)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import signal
import socket
import sys
import time
from pathlib import Path

from railyard.api.lora import LoRAModule, lora_request, parse_lora_module
from railyard.engine.args import add_engine_args, engine_config_from_args
from railyard.engine.client.base import DEFAULT_MAX_WAITING_REQUESTS
from railyard.engine.startup.background import Background
from railyard.engine.startup.gc_heap import freeze_startup_heap
from railyard.engine.tokenizer import with_shape_tokenizer
from railyard.envs import RAILYARD_API_KEY
from railyard.errors import STOP_SIGNALS, ConfigError, InvalidRequestError, Stopped

# A client that reuses a pooled connection just as the server closes it as idle loses that request (a POST is
# not retried), so the server must be the side that waits longer: longer than httpx's and the openai client's
# 5 s (uvicorn's default, the same 5 s: a race), aiohttp's 15 s, and the 60 s of vLLM's benchmark client, AWS
# load balancers and ingress-nginx's upstream pool. 75 s is nginx's own default.
DEFAULT_KEEP_ALIVE_S = 75


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port)")
    p.add_argument("--api-key", default=RAILYARD_API_KEY.get(),
                   help="require 'Authorization: Bearer KEY' on every route but /health and /metrics, the API docs "
                        "included (default: $RAILYARD_API_KEY)")
    p.add_argument("--served-model-name", help="the model name clients use (default: the checkpoint dir name)")
    p.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
                   help="requests allowed to wait for a batch slot before new ones get 503 + Retry-After")
    p.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024, help="largest request body (413 above)")
    p.add_argument("--timeout-keep-alive", type=int, default=DEFAULT_KEEP_ALIVE_S,
                   help="seconds an idle connection stays open; keep it above your clients' and proxies' pool idle "
                        f"timeouts (default: {DEFAULT_KEEP_ALIVE_S})")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in its own process, so HTTP, SSE and tokenisation never share a GIL with "
                        "the step loop (default); --no-engine-process runs it on a thread of the server, for debugging")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="log level of uvicorn and railyard")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help="LoRA adapters (PEFT directories) to serve from the start, each as name=path or vLLM's JSON "
                        "form {\"name\": ..., \"path\": ..., \"base_model_name\": ...}; a request's model names "
                        "one (implies --enable-lora)")
    p.add_argument("--enable-lora-runtime-updates", action="store_true",
                   help="allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING; behind --api-key where one is set; implies --enable-lora) "
                        "(default: off)")
    p.add_argument("--enable-sleep-endpoints", action="store_true",
                   help="serve POST /sleep?level=1|2, POST /wake_up and GET /is_sleeping (vLLM's dev-mode routes; "
                        "behind --api-key where one is set; implies --enable-sleep-mode) (default: off)")
    add_engine_args(p)
    p.add_argument("--config", help="stack YAML: serve its models on Ray Serve instead (see `railyard cluster up`) "
                                    "(default: none: one engine in this process)")
    p.add_argument("--address", help="with --config: the Ray cluster to join (default: start Ray here)")
    p.set_defaults(func=run_serve)


def curl_example(base_url: str, model: str, api_key: str | None) -> str:
    auth = " -H 'Authorization: Bearer $RAILYARD_API_KEY'" if api_key else ""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16})
    return f"curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def start_engine_client(config, *, engine_process: bool = True, **client_args):
    """An engine client for a checkpoint dir, or for a named shape with random weights (GPU serving benchmarks),
    which then speaks through the embedded model's byte-level tokenizer (ids < 259 fit every vocabulary).

    With engine_process (the default) the engine core starts in its own process; this returns once it is
    ready, or raises its start-up error (ConfigError, ModelLoadError) with the core's message.
    """
    from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir
    from railyard.shapes import is_shape

    if not with_shape_tokenizer(config) and not is_shape(config.model):
        resolve_model_dir(config.model)  # a missing directory fails here, before any process starts
    if engine_process:
        from railyard.engine.client.process import EngineProcessClient

        return EngineProcessClient(config, **client_args)
    from railyard.engine.client.inproc import InProcessEngineClient

    return InProcessEngineClient.from_config(config, **client_args)


def _import_front() -> None:
    try:
        import uvicorn  # noqa: F401

        import railyard.api.app  # noqa: F401
    except Exception:  # imported again where used, which raises it there
        pass


def run_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM, which stop the server and its engine core and exit with 128 + the signal
    (railyard.errors.Stopped: 130 for Ctrl-C, as shells expect, the same as `railyard cluster up`)."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_waiting_requests < 1 or args.max_request_bytes < 1 or args.timeout_keep_alive < 1:
        raise ConfigError("--max-waiting-requests, --max-request-bytes and --timeout-keep-alive must be positive")
    for sig in STOP_SIGNALS:  # while the engine starts; the server takes over once it runs
        signal.signal(sig, Stopped.handler)
    started_at = getattr(args, "started_at", None) or time.time()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lora_modules = [parse_lora_module(m) for m in args.lora_modules]
    lora: dict = {"enable_lora": True} if lora_modules or args.enable_lora_runtime_updates else {}
    if args.enable_sleep_endpoints:  # the routes need an engine that may sleep
        lora["enable_sleep_mode"] = True
    config = engine_config_from_args(args, served_model_name=args.served_model_name, **lora)
    check_lora_modules(lora_modules, config)  # a bad adapter is an error before the model loads
    sock = bind_socket(args.host, args.port)  # a taken port is an error before the model loads, not after
    front_ready = time.time()
    # The HTTP front's imports (FastAPI, uvicorn, transformers, torch) run while the engine starts, not before; in
    # the background's short GIL switches, since with --no-engine-process the model loads on this thread meanwhile.
    front_imports = Background(_import_front, name="railyard-front-imports")
    try:
        engine = start_engine_client(config, engine_process=args.engine_process,
                                     max_waiting_requests=args.max_waiting_requests)
    except BaseException:
        sock.close()
        raise
    waited = time.perf_counter()
    front_imports.result()

    from railyard.api.app import engine_app
    from railyard.api.server import Server, uvicorn

    startup = engine.model_info.startup
    if startup is not None:
        startup.add("front_imports", front_ready - started_at)
        startup.add("front_imports_wait", time.perf_counter() - waited)  # the part the engine's start did not hide
    name = engine.model_info.served_model_name

    def on_ready() -> None:  # the start-up report is complete: what no phase took since railyard started
        freeze_startup_heap()  # this process serves this engine for its life
        if startup is not None and "server_start" not in startup.phases:
            startup.add_rest("server_start", started_at)

    app = engine_app(engine, served_model_name=name, api_key=args.api_key, max_request_bytes=args.max_request_bytes,
                     on_ready=on_ready, lora_modules=lora_modules,
                     lora_runtime_updates=args.enable_lora_runtime_updates,
                     sleep_endpoints=args.enable_sleep_endpoints)
    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                   timeout_keep_alive=args.timeout_keep_alive, timeout_graceful_shutdown=5))

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        if startup is not None:  # reported once, as /metrics has it
            print(f"railyard serve: {startup.describe()}", flush=True)
        port = server.servers[0].sockets[0].getsockname()[1]
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        base = f"http://{host}:{port}"
        print(f"railyard serve: {name} on {base} (OpenAI API under {base}/v1, metrics at {base}/metrics)\n"
              f"try:\n  {curl_example(base, name, args.api_key)}", flush=True)

    async def main() -> None:
        announcer = asyncio.ensure_future(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            announcer.cancel()

    asyncio.run(main())
    if server.stopped_by is not None:
        raise Stopped(server.stopped_by)
    if not server.started:
        print(f"railyard serve: error: could not serve on {args.host}:{args.port}", file=sys.stderr)
        return 2
    return 0


def check_lora_modules(modules: list[LoRAModule], config) -> None:
    """Each --lora-modules adapter checked against the model as the engine checks it (files, format, shapes,
    rank), and their names unique: a ConfigError naming the adapter, before anything starts."""
    if not modules:
        return
    from railyard.engine.lora.peft import inspect_adapter
    from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir
    from railyard.model.spec import ModelSpec, read_model_spec
    from railyard.shapes import is_shape, shape_config

    served = config.served_model_name or Path(config.model).name  # the engine's own default
    if is_shape(config.model) and not Path(config.model).exists():
        spec = ModelSpec.from_hf_config(shape_config(config.model))
    else:
        spec = read_model_spec(resolve_model_dir(config.model))
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ConfigError(f"--lora-modules: adapter names must be unique, got {', '.join(names)}")
    for module in modules:
        if module.name == served:
            raise ConfigError(f"--lora-modules {module.name}: the served model has that name; name the adapter "
                              "otherwise")
        if module.base_model_name not in (None, served):
            raise ConfigError(f"--lora-modules {module.name}: base_model_name {module.base_model_name!r} is not the "
                              f"served model {served!r}")
        try:
            inspect_adapter(lora_request(module.name, module.path), spec, config.max_lora_rank)
        except InvalidRequestError as exc:
            raise ConfigError(f"--lora-modules: {exc}") from None


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port, or a ConfigError saying why not (a port in use): checked before the engine
    loads, so a taken port costs no model load. uvicorn listens on it once the engine is ready."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigError(f"could not listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a TIME_WAIT port is free
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = "; pick another --port (0: any free port)" if exc.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"could not listen on {host}:{port}: {exc.strerror}{hint}") from None
    return sock
