"""`railyard cluster up --config stack.yaml` (and `railyard serve --config stack.yaml`): the stack's
Ray Serve application on a local Ray, or on an existing Ray cluster with --address."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from railyard.envs import cache_root
from railyard.errors import STOP_SIGNALS, ConfigError, Stopped
from railyard.serve import haproxy_local, mps, processes
from railyard.serve.preflight import check_local_models
from railyard.serve.autoscaling import POLICIES
from railyard.serve.spec import ROUTER_NAMES
from railyard.stack import Ingress


def add_stack_args(p: argparse.ArgumentParser, *, config_required: bool) -> None:
    p.add_argument("--config", "-c", required=config_required,
                   help="stack YAML: serve its models on Ray Serve (replicas, routing, autoscaling)")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join, e.g. ray://head:10001 or auto (default: start Ray here)")
    p.add_argument("--cpu", action="store_true", default=None,
                   help="run engines on the CPU (default: only when the Ray cluster has no GPUs)")
    p.add_argument("--deploy-timeout", type=float, default=600.0, help="seconds to wait for every replica")
    p.add_argument("--router", choices=ROUTER_NAMES, default=None,
                   help="request router of the engine deployments (default: pending_prefix; the others are "
                        "baselines: round_robin, Ray's power_of_two)")
    p.add_argument("--autoscaling-policy", choices=list(POLICIES), default=None,
                   help="policy of the autoscaling deployments (default: pending, railyard's pending requests per "
                        "replica; ray_default is Ray Serve's own, the baseline)")


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="run a stack on Ray Serve (local Ray or an existing cluster)")
    kinds = cluster.add_subparsers(dest="cluster_command", required=True)
    up = kinds.add_parser("up", help="deploy the stack's models and serve the OpenAI API until Ctrl-C")
    up.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy binds")
    up.add_argument("--port", type=int, default=8000, help="port the HTTP proxy binds")
    add_stack_args(up, config_required=True)
    up.set_defaults(func=run_stack)
    cache = sub.add_parser("cache", help="railyard's kernel cache ($RAILYARD_CACHE)")
    cache_kinds = cache.add_subparsers(dest="cache_command", required=True)
    fill = cache_kinds.add_parser(
        "fill", help="start each engine of a stack once here so its kernels land in $RAILYARD_CACHE (run on the "
                     "stack's GPU with the image's software; the stack's kernel_cache says where replicas look)")
    fill.add_argument("--config", "-c", required=True, help="stack YAML")
    fill.add_argument("--model", action="append", default=None, help="only this model of the stack (repeatable)")
    fill.add_argument("--device", default=None, help="run the engines here (default: each engine's own)")
    fill.set_defaults(func=run_cache_fill)


def run_cache_fill(args: argparse.Namespace) -> int:
    """Print one JSON line per engine started, then where the cache is."""
    import json

    from railyard.envs import cache_root
    from railyard.serve.cache_fill import fill
    from railyard.stack import load_stack

    for filled in fill(load_stack(args.config), args.model, args.device):
        print(json.dumps(filled.as_dict()), flush=True)
    print(f"railyard cache fill: kernels in {cache_root()} (set RAILYARD_CACHE to fill another directory)")
    return 0


def run_serve_config(args: argparse.Namespace) -> int:
    """`railyard serve --config STACK`: the stack's replicas on Ray Serve behind the same OpenAI app, with
    `cluster up`'s defaults for the flags `serve` does not have."""
    args.cpu, args.deploy_timeout = None, 600.0
    return run_stack(args)


def local_mps(stack, args: argparse.Namespace) -> bool:
    """Whether this `cluster up` starts a CUDA MPS daemon (railyard.serve.mps): a Ray it starts itself, engines
    not forced onto the CPU, and a model whose replicas share GPUs under gpu_sharing mps."""
    return not args.address and not args.cpu and any(m.mps_shared for m in stack.models)


# How long an ingress replica behind HAProxy keeps serving once told to stop. Ray's 30 s default gives an external
# load balancer (a cloud LB in front of a cluster's nodes) time to deregister it; on a Ray of our own the only one
# is Serve's HAProxy, reconfigured within Ray's 0.1 s broadcast, and 30 s would be each Ctrl-C's wait.
LOCAL_INGRESS_DRAIN_ENV, LOCAL_INGRESS_DRAIN_S = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2"


def use_proxy(ingress: Ingress) -> None:
    """Put the stack's proxy choice in this process's environment, which the Ray it starts here inherits; haproxy
    without an HAProxy binary is a ConfigError (Ray would fail later, in its controller's log)."""
    if ingress.proxy == "haproxy":
        from ray.serve._private.haproxy import get_haproxy_binary

        try:
            binary = get_haproxy_binary()
        except FileNotFoundError:
            raise ConfigError("ingress.proxy haproxy needs an HAProxy binary (ray[serve] bundles one on Linux, or "
                              "set RAY_SERVE_HAPROXY_BINARY_PATH); or set ingress.proxy: ray") from None
        launcher = haproxy_local.install_launcher(binary, cache_root() / "haproxy")
        os.environ[haproxy_local.BINARY_ENV] = str(launcher)  # admin ports on loopback (serve/haproxy_local.py)
        os.environ.setdefault(LOCAL_INGRESS_DRAIN_ENV, LOCAL_INGRESS_DRAIN_S)
    os.environ.update(ingress.ray_env())


STOP_GRACE_S = 60.0  # removing the apps and Serve (replicas drain) before what is left is stopped by signal


def _on_stop_signals(handler) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


def _start_ray(address: str | None) -> str:
    """ray.init, with Ray's own SIGTERM handler (installed at its start: sys.exit(15)) read as a stop. No job-level
    runtime_env: the replicas then take the workers Ray starts ahead of time. Returns the Ray cluster's GCS
    address."""
    import ray

    try:
        ray.init(address=address, log_to_driver=False)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:
            raise Stopped(signal.SIGTERM) from None
        raise
    finally:
        _on_stop_signals(Stopped.handler)  # ray.init replaced SIGTERM's
    return ray.get_runtime_context().gcs_address


def run_stack(args: argparse.Namespace) -> int:
    """Deploy the stack and serve until Ctrl-C or SIGTERM; either (even mid-deploy) removes it again and exits with
    128 + the signal (railyard.errors.Stopped: 130 for Ctrl-C, as `railyard serve`). A stack that cannot come up
    (a missing checkpoint, replicas Ray cannot place, a replica that fails) exits 2 with the reason."""
    from railyard.serve.launch import deploy
    from railyard.stack import load_stack, to_serve_config

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    stack = load_stack(args.config)
    config = to_serve_config(stack)
    own_ray = not args.address
    if own_ray:
        check_local_models(stack)  # its replicas read these paths on this machine: say so before Ray starts
        use_proxy(stack.ingress)  # a Ray of our own: its processes inherit the proxy choice (on a cluster, its env)
    _on_stop_signals(Stopped.handler)
    processes.adopt_orphans()  # an HAProxy whose Ray worker died becomes ours to stop, not init's
    daemon = mps.start() if local_mps(stack, args) else None  # before Ray: its processes inherit the pipe
    code = 0
    try:
        gcs = _start_ray(args.address)
        url = deploy(config, host=args.host, port=args.port, cpu=args.cpu, router=getattr(args, "router", None),
                     autoscaling_policy=getattr(args, "autoscaling_policy", None), timeout_s=args.deploy_timeout,
                     progress=lambda line: print(f"railyard: replicas: {line}", file=sys.stderr, flush=True),
                     own_ray=own_ray)
        names = ", ".join(m.name for m in stack.models)
        print(f"railyard: {names} on Ray Serve at {url} (OpenAI API under {url}/v1, metrics at {url}/metrics; "
              f"Ray at {gcs}); Ctrl-C to stop", flush=True)
        threading.Event().wait()
    except Stopped as stop:
        code = stop.exit_code
    finally:
        _on_stop_signals(signal.SIG_IGN)  # the stop below is bounded; a second Ctrl-C must not cut it short
        _stop_stack([app["name"] for app in config["applications"]], own_ray, daemon)
    return code


def _remove_apps(app_names: list[str], own_ray: bool) -> None:
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    for name in app_names:
        serve.delete(name)  # its replicas drain
    if own_ray:  # our own Ray goes too; what it leaves (Serve's HAProxy) is stopped with the other descendants
        # (serve.shutdown() first would only add Ray's report of the controller it kills mid-call)
        ray.shutdown()


def _stop_stack(app_names: list[str], own_ray: bool, daemon) -> None:
    """Remove the apps (replicas drain) and, on a Ray of our own, Serve and Ray, within STOP_GRACE_S; then stop
    what is left of what this process started (processes.stop_descendants). If the graceful part hung (Ray's GCS
    gone under it), this process exits at once: Ray's own exit handler would wait for that GCS too."""
    graceful = threading.Thread(target=_remove_apps, args=(app_names, own_ray), name="railyard-stop", daemon=True)
    graceful.start()
    graceful.join(STOP_GRACE_S)
    if daemon is not None:
        daemon.stop()  # the MPS server quits once its clients have gone
    processes.stop_descendants()
    print("railyard: stopped", file=sys.stderr, flush=True)
    if graceful.is_alive():
        sys.stdout.flush()
        os._exit(Stopped(signal.SIGTERM).exit_code)
