"""`railyard deploy render|validate`, `railyard doctor`, `railyard plan`: layer 1's commands.

Imports stay light (no torch, no Ray): each command loads its module only when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from railyard.errors import ConfigError


def _render(args: argparse.Namespace) -> int:
    from railyard.cluster.render import render, to_yaml
    from railyard.cluster.validate import validate_objects
    from railyard.stack import load_stack

    stack = load_stack(args.config)
    objects = render(stack, args.mode)
    problems = validate_objects(objects, args.kubernetes_version or stack.kubernetes_version, "rendered")
    if problems:  # a bug in railyard, not the user's input: say so loudly rather than emit bad YAML
        raise ConfigError("rendered manifests do not validate: " + "; ".join(map(str, problems)))
    text = to_yaml(objects)
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        print(f"wrote {len(objects)} objects to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from railyard.cluster.validate import load_manifests, schema_version, validate_objects

    version = schema_version(args.kubernetes_version)
    failed = 0
    for name in args.files:
        objects = load_manifests(name)
        problems = validate_objects(objects, version, name)
        for problem in problems:
            print(f"ERROR {problem}")
        if problems:
            failed += 1
        else:
            print(f"OK {name}: {len(objects)} objects valid for Kubernetes {version}")
    return 1 if failed else 0


def _doctor(args: argparse.Namespace) -> int:
    from railyard.cluster.doctor import format_report, run_checks
    from railyard.cluster.doctor.probe import LiveProbe, RecordedProbe
    from railyard.cluster.doctor.report import ShowProgress

    probe = RecordedProbe(Path(args.recorded)) if args.recorded else LiveProbe(kubeconfig=args.kubeconfig)
    progress = ShowProgress(probe, sys.stderr) if sys.stderr.isatty() and not args.recorded else None
    try:
        results = run_checks(progress or probe, node=not args.cluster_only, cluster=not args.node_only)
    finally:
        if progress:
            progress.done()
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(format_report(results))
    return 1 if any(r.status == "fail" for r in results) else 0


def _plan(args: argparse.Namespace) -> int:
    if args.bench:
        from railyard.cluster.plan_bench import main as bench_main

        return bench_main(["--nodes", str(args.bench_nodes), "--pods", str(args.bench_pods)])
    from railyard.cluster.plan import format_plan, plan_from_files

    if not args.nodes or not args.config:
        raise ConfigError("plan needs --nodes FILE and --config STACK (or --bench)")
    if (args.target_rps is None) != (args.profile is None):
        raise ConfigError("--target-rps and --profile go together: the profile says what one replica serves")
    result = plan_from_files(
        args.config,
        args.nodes,
        mode=args.mode,
        bench=args.profile,
        target_rps=args.target_rps,
        at_max=args.at_max,
        pods_path=args.pods,
    )
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(format_plan(result))
    return 0 if result.all_placed else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `deploy`, `doctor` and `plan` to the railyard CLI."""
    deploy = subparsers.add_parser("deploy", help="render and validate Kubernetes manifests")
    deploy_sub = deploy.add_subparsers(dest="deploy_command", required=True)

    render = deploy_sub.add_parser("render", help="stack file -> RayService or Deployment YAML")
    render.add_argument("--config", "-c", required=True, help="stack YAML file")
    render.add_argument("--mode", choices=["rayservice", "deployment"], help="default: the stack's mode")
    render.add_argument("--kubernetes-version", help="default: the stack's kubernetes_version")
    render.add_argument("--output", "-o", help="file to write (default: stdout)")
    render.set_defaults(func=_render)

    validate = deploy_sub.add_parser("validate", help="check manifests against Kubernetes and KubeRay schemas")
    validate.add_argument("files", nargs="+", help="manifest YAML files")
    validate.add_argument("--kubernetes-version", default="1.30", help="the Kubernetes schemas to check against")
    validate.set_defaults(func=_validate)

    doctor = subparsers.add_parser("doctor", help="preflight GPU nodes and the cluster's GPU stack")
    doctor.add_argument("--kubeconfig", help="kubeconfig for the cluster checks (default: kubectl's)")
    doctor.add_argument("--node-only", action="store_true", help="only this machine's driver/toolkit/devices")
    doctor.add_argument("--cluster-only", action="store_true", help="only the Kubernetes API checks")
    doctor.add_argument("--recorded", help="directory of recorded command outputs to check instead of live")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON instead of a table")
    doctor.set_defaults(func=_doctor)

    plan = subparsers.add_parser("plan", help="predict placement with kube-scheduler's rules, and size replicas")
    plan.add_argument("--nodes", help="inventory.yaml or `kubectl get nodes -o json` output")
    plan.add_argument("--config", "-c", help="stack YAML file")
    plan.add_argument("--pods", help="`kubectl get pods -A -o json` output: what already runs on the nodes")
    plan.add_argument("--mode", choices=["rayservice", "deployment"], help="default: the stack's mode")
    plan.add_argument("--profile", help="engine bench JSON (railyard bench throughput) for replica sizing")
    plan.add_argument("--target-rps", type=float, help="target requests/s to size replicas for")
    plan.add_argument("--at-max", action="store_true", help="plan autoscaled groups at their max replicas")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
    plan.add_argument("--bench", action="store_true", help="time the planner on a synthetic cluster")
    plan.add_argument("--bench-nodes", type=int, default=1000, help="with --bench: nodes of the synthetic cluster")
    plan.add_argument("--bench-pods", type=int, default=2000, help="with --bench: pods to place on it")
    plan.set_defaults(func=_plan)
